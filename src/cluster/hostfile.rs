//! DeepSpeed-style hostfiles and `--include`/`--exclude` filters.
//!
//! Owns: reading a hostfile (`host slots=N` per line as DeepSpeed writes it, or one bare
//! host per line), and narrowing any discovered node list with DeepSpeed's filter syntax
//! `host1:0,1@host2`. Must not decide where nodes come from; that is [`super::discover`].
//!
//! Filters behave as DeepSpeed's launcher (`parse_resource_filter` in
//! `deepspeed/launcher/runner.py`): `--include` keeps only the named hosts (and on a host
//! with a slot list, only those slots); `--exclude` drops named hosts, or only the named
//! slots, and a host left with no slot is dropped. Hosts keep the node list's order, not
//! the filter's. Slot numbers are device indices on that host.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{Node, Slots};

/// Why a hostfile could not be read. Line numbers count from 1.
#[derive(Debug, thiserror::Error)]
pub enum HostfileError {
    #[error("cannot read hostfile {path}: {source} (check the path passed to --hostfile)", path = .path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "hostfile {path} line {line}: slots value \"{value}\" is not a number \
         (write slots=N with N a positive integer)",
        path = .path.display()
    )]
    BadSlots {
        path: PathBuf,
        line: usize,
        value: String,
    },
    #[error(
        "hostfile {path} line {line}: slots=0 gives the host nothing to run \
         (write slots=N with N a positive integer, or remove the line)",
        path = .path.display()
    )]
    ZeroSlots { path: PathBuf, line: usize },
    #[error(
        "hostfile {path} line {line}: unexpected \"{token}\" \
         (write \"HOST\" or \"HOST slots=N\" on each line; # starts a comment)",
        path = .path.display()
    )]
    UnknownToken {
        path: PathBuf,
        line: usize,
        token: String,
    },
    #[error(
        "hostfile {path} line {line}: \"{host}\" is not a host name \
         (write one host per line as \"HOST\" or \"HOST slots=N\"; hostlist expressions go in --hosts)",
        path = .path.display()
    )]
    BadHostName {
        path: PathBuf,
        line: usize,
        host: String,
    },
    #[error(
        "hostfile {path} line {line}: host \"{host}\" is already listed on line {first_line} \
         (list each host once)",
        path = .path.display()
    )]
    DuplicateHost {
        path: PathBuf,
        line: usize,
        host: String,
        first_line: usize,
    },
    #[error(
        "hostfile {path} lists no hosts (write one \"HOST slots=N\" per line)",
        path = .path.display()
    )]
    NoHosts { path: PathBuf },
}

/// Reads a hostfile; see [`parse_hostfile`].
pub fn read_hostfile(path: &Path) -> Result<Vec<Node>, HostfileError> {
    let text = std::fs::read_to_string(path).map_err(|source| HostfileError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    parse_hostfile(&text, path)
}

/// Parses a hostfile's text; `path` only names the file in errors.
///
/// Each line is `HOST slots=N` (DeepSpeed; gives [`Slots::Count`]) or a bare `HOST`
/// (gives [`Slots::Unknown`]); `#` starts a comment that runs to the end of the line;
/// blank lines are skipped. Hosts keep the file's order.
pub fn parse_hostfile(text: &str, path: &Path) -> Result<Vec<Node>, HostfileError> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut first_lines: Vec<usize> = Vec::new();
    // Editors on Windows may start the file with a byte-order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split_once('#').map_or(raw, |(before, _)| before);
        let mut tokens = content.split_whitespace();
        let Some(host) = tokens.next() else {
            continue;
        };
        if host.contains(['=', '[', ']', ',', '@']) {
            return Err(HostfileError::BadHostName {
                path: path.to_path_buf(),
                line,
                host: host.to_string(),
            });
        }
        let mut slots = Slots::Unknown;
        for token in tokens {
            match token.strip_prefix("slots=") {
                Some(value) if slots == Slots::Unknown => {
                    slots = Slots::Count(parse_slots(value, path, line)?);
                }
                _ => {
                    return Err(HostfileError::UnknownToken {
                        path: path.to_path_buf(),
                        line,
                        token: token.to_string(),
                    })
                }
            }
        }
        if let Some(at) = nodes.iter().position(|node| node.host == host) {
            return Err(HostfileError::DuplicateHost {
                path: path.to_path_buf(),
                line,
                host: host.to_string(),
                first_line: first_lines[at],
            });
        }
        nodes.push(Node {
            host: host.to_string(),
            slots,
        });
        first_lines.push(line);
    }
    if nodes.is_empty() {
        return Err(HostfileError::NoHosts {
            path: path.to_path_buf(),
        });
    }
    Ok(nodes)
}

fn parse_slots(value: &str, path: &Path, line: usize) -> Result<u32, HostfileError> {
    let bad = || HostfileError::BadSlots {
        path: path.to_path_buf(),
        line,
        value: value.to_string(),
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match value.parse::<u32>() {
        Ok(0) => Err(HostfileError::ZeroSlots {
            path: path.to_path_buf(),
            line,
        }),
        Ok(n) => Ok(n),
        Err(_) => Err(bad()),
    }
}

/// Which way a filter works: `--include` or `--exclude`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterMode {
    Include,
    Exclude,
}

impl FilterMode {
    /// The command-line flag, for messages.
    pub fn flag(self) -> &'static str {
        match self {
            FilterMode::Include => "--include",
            FilterMode::Exclude => "--exclude",
        }
    }
}

impl std::fmt::Display for FilterMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.flag())
    }
}

/// A parsed `--include`/`--exclude` value: `NODE_SPEC[@NODE_SPEC...]`,
/// `NODE_SPEC = HOST[:SLOT[,SLOT...]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFilter {
    pub mode: FilterMode,
    pub entries: Vec<FilterEntry>,
}

/// One host of a filter; `slots` is `None` for the whole host. Slot lists are sorted and
/// without repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterEntry {
    pub host: String,
    pub slots: Option<Vec<u32>>,
}

/// Why a filter could not be parsed or applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("--include and --exclude were both given (use one of them)")]
    BothGiven,
    #[error("{mode} \"{filter}\": empty host name (write HOST or HOST:SLOT,SLOT, joined with @)")]
    EmptyHost { mode: FilterMode, filter: String },
    #[error(
        "{mode} \"{filter}\": slot \"{slot}\" on host \"{host}\" is not a number \
         (write slot indices as HOST:0,1)"
    )]
    BadSlot {
        mode: FilterMode,
        filter: String,
        host: String,
        slot: String,
    },
    #[error(
        "{mode} \"{filter}\": \"{entry}\" has more than one ':' \
         (write HOST:SLOT,SLOT and join hosts with @)"
    )]
    ExtraColon {
        mode: FilterMode,
        filter: String,
        entry: String,
    },
    #[error("{mode} \"{filter}\": host \"{host}\" is named twice (name each host once)")]
    RepeatedHost {
        mode: FilterMode,
        filter: String,
        host: String,
    },
    #[error("{mode}: host \"{host}\" is not in the node list ({known}) (name a listed host)")]
    UnknownHost {
        mode: FilterMode,
        host: String,
        known: String,
    },
    #[error(
        "{mode}: host \"{host}\" has no slot {slot} (its slots are {available}) \
         (name slots the host has)"
    )]
    UnknownSlot {
        mode: FilterMode,
        host: String,
        slot: u32,
        available: String,
    },
    #[error(
        "{mode}: cannot exclude slots of host \"{host}\": its slot count is unknown \
         (exclude the whole host, or give its slots with a hostfile's slots=N)"
    )]
    UnknownSlotCount { mode: FilterMode, host: String },
    #[error("{mode} \"{filter}\" leaves no nodes (keep at least one host and slot)")]
    NothingLeft { mode: FilterMode, filter: String },
}

/// Parses a filter value. An empty value is a filter with no entries (DeepSpeed treats
/// `--include ""` as not given).
pub fn parse_filter(mode: FilterMode, filter: &str) -> Result<NodeFilter, FilterError> {
    let mut entries: Vec<FilterEntry> = Vec::new();
    if filter.trim().is_empty() {
        return Ok(NodeFilter { mode, entries });
    }
    for spec in filter.split('@') {
        let spec = spec.trim();
        let (host, slot_list) = match spec.split_once(':') {
            Some((host, slots)) => (host.trim(), Some(slots)),
            None => (spec, None),
        };
        if host.is_empty() {
            return Err(FilterError::EmptyHost {
                mode,
                filter: filter.to_string(),
            });
        }
        if slot_list.is_some_and(|slots| slots.contains(':')) {
            return Err(FilterError::ExtraColon {
                mode,
                filter: filter.to_string(),
                entry: spec.to_string(),
            });
        }
        let slots = match slot_list {
            None => None,
            Some(list) => {
                let mut slots = BTreeSet::new();
                for slot in list.split(',') {
                    let slot = slot.trim();
                    let number = slot
                        .parse::<u32>()
                        .ok()
                        .filter(|_| slot.bytes().all(|b| b.is_ascii_digit()));
                    match number {
                        Some(n) => {
                            slots.insert(n);
                        }
                        None => {
                            return Err(FilterError::BadSlot {
                                mode,
                                filter: filter.to_string(),
                                host: host.to_string(),
                                slot: slot.to_string(),
                            })
                        }
                    }
                }
                Some(slots.into_iter().collect())
            }
        };
        if entries.iter().any(|entry| entry.host == host) {
            return Err(FilterError::RepeatedHost {
                mode,
                filter: filter.to_string(),
                host: host.to_string(),
            });
        }
        entries.push(FilterEntry {
            host: host.to_string(),
            slots,
        });
    }
    Ok(NodeFilter { mode, entries })
}

/// Applies `--include` or `--exclude` (given as their raw values) to a node list.
/// Neither, or an empty value, returns the list unchanged; both is an error.
pub fn filter_nodes(
    nodes: Vec<Node>,
    include: Option<&str>,
    exclude: Option<&str>,
) -> Result<Vec<Node>, FilterError> {
    let include = include.filter(|text| !text.trim().is_empty());
    let exclude = exclude.filter(|text| !text.trim().is_empty());
    match (include, exclude) {
        (Some(_), Some(_)) => Err(FilterError::BothGiven),
        (Some(text), None) => {
            let filter = parse_filter(FilterMode::Include, text)?;
            apply_filter(nodes, &filter, text)
        }
        (None, Some(text)) => {
            let filter = parse_filter(FilterMode::Exclude, text)?;
            apply_filter(nodes, &filter, text)
        }
        (None, None) => Ok(nodes),
    }
}

/// Applies a parsed filter; `written` is the filter as the user wrote it, for messages.
///
/// A slot list turns `Count(n)` into `Devices`; on `Unknown` slots, `--include` with a
/// slot list gives exactly those devices and `--exclude` with a slot list is an error.
pub fn apply_filter(
    nodes: Vec<Node>,
    filter: &NodeFilter,
    written: &str,
) -> Result<Vec<Node>, FilterError> {
    if filter.entries.is_empty() {
        return Ok(nodes);
    }
    let mode = filter.mode;
    // Check every entry against the list first, so errors do not depend on order.
    for entry in &filter.entries {
        let Some(node) = nodes.iter().find(|node| node.host == entry.host) else {
            return Err(FilterError::UnknownHost {
                mode,
                host: entry.host.clone(),
                known: known_hosts(&nodes),
            });
        };
        if let Some(slots) = &entry.slots {
            match device_indices(&node.slots) {
                Some(available) => {
                    if let Some(&slot) = slots.iter().find(|slot| !available.contains(slot)) {
                        return Err(FilterError::UnknownSlot {
                            mode,
                            host: entry.host.clone(),
                            slot,
                            available: describe_slots(&available),
                        });
                    }
                }
                None if mode == FilterMode::Exclude => {
                    return Err(FilterError::UnknownSlotCount {
                        mode,
                        host: entry.host.clone(),
                    })
                }
                None => {}
            }
        }
    }
    let entry_for = |host: &str| filter.entries.iter().find(|entry| entry.host == host);
    let mut kept = Vec::new();
    for node in nodes {
        let entry = entry_for(&node.host);
        let node = match (mode, entry) {
            (FilterMode::Include, None) => None,
            (FilterMode::Include, Some(entry)) => match &entry.slots {
                None => Some(node),
                Some(slots) => Some(Node {
                    host: node.host,
                    slots: Slots::Devices(slots.clone()),
                }),
            },
            (FilterMode::Exclude, None) => Some(node),
            (FilterMode::Exclude, Some(entry)) => match &entry.slots {
                None => None,
                Some(removed) => {
                    let left: Vec<u32> = device_indices(&node.slots)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|slot| !removed.contains(slot))
                        .collect();
                    (!left.is_empty()).then_some(Node {
                        host: node.host,
                        slots: Slots::Devices(left),
                    })
                }
            },
        };
        kept.extend(node);
    }
    if kept.is_empty() {
        return Err(FilterError::NothingLeft {
            mode,
            filter: written.to_string(),
        });
    }
    Ok(kept)
}

/// The device indices a node offers, when known: `0..n` for `Count(n)`.
fn device_indices(slots: &Slots) -> Option<Vec<u32>> {
    match slots {
        Slots::Unknown => None,
        Slots::Count(n) => Some((0..*n).collect()),
        Slots::Devices(devices) => Some(devices.clone()),
    }
}

fn describe_slots(slots: &[u32]) -> String {
    if slots.is_empty() {
        return "none".to_string();
    }
    let list: Vec<String> = slots.iter().map(u32::to_string).collect();
    list.join(",")
}

/// The listed hosts for a message, shortened when the list is long.
fn known_hosts(nodes: &[Node]) -> String {
    const SHOWN: usize = 8;
    let mut names: Vec<&str> = nodes.iter().take(SHOWN).map(|n| n.host.as_str()).collect();
    if nodes.len() > SHOWN {
        names.push("...");
    }
    format!("listed: {}", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, slots: Slots) -> Node {
        Node {
            host: host.to_string(),
            slots,
        }
    }

    fn parse(text: &str) -> Result<Vec<Node>, HostfileError> {
        parse_hostfile(text, Path::new("hosts.txt"))
    }

    fn four_by_four() -> Vec<Node> {
        ["w0", "w1", "w2", "w3"]
            .iter()
            .map(|h| node(h, Slots::Count(4)))
            .collect()
    }

    #[test]
    fn deepspeed_hostfile_with_comments_and_blank_lines() {
        let text = "# cluster A\n\nworker-1 slots=8   # first\n  worker-0\tslots=4\n\n#end\n";
        let nodes = parse(text).unwrap();
        assert_eq!(
            nodes,
            [
                node("worker-1", Slots::Count(8)),
                node("worker-0", Slots::Count(4))
            ]
        );
    }

    #[test]
    fn plain_one_host_per_line_has_unknown_slots() {
        let nodes = parse("\u{feff}a\nb # spare\r\nc slots=2\n").unwrap();
        assert_eq!(
            nodes,
            [
                node("a", Slots::Unknown),
                node("b", Slots::Unknown),
                node("c", Slots::Count(2))
            ]
        );
    }

    #[test]
    fn hostfile_errors_name_file_and_line() {
        let error = parse("a slots=8\n\nb slots=eight\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "hostfile hosts.txt line 3: slots value \"eight\" is not a number \
             (write slots=N with N a positive integer)"
        );
        assert!(matches!(
            parse("a slots=\n"),
            Err(HostfileError::BadSlots { line: 1, .. })
        ));
        assert!(matches!(
            parse("a slots=-1\n"),
            Err(HostfileError::BadSlots { .. })
        ));
        assert!(matches!(
            parse("a slots=99999999999\n"),
            Err(HostfileError::BadSlots { .. })
        ));
        assert!(matches!(
            parse("a slots=0\n"),
            Err(HostfileError::ZeroSlots { line: 1, .. })
        ));
        match parse("a\nb gpus=4\n") {
            Err(HostfileError::UnknownToken { line: 2, token, .. }) => assert_eq!(token, "gpus=4"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse("a slots=4 slots=8\n"),
            Err(HostfileError::UnknownToken { line: 1, .. })
        ));
        assert!(matches!(
            parse("slots=4\n"),
            Err(HostfileError::BadHostName { line: 1, .. })
        ));
        assert!(matches!(
            parse("gpu[1-4] slots=4\n"),
            Err(HostfileError::BadHostName { .. })
        ));
        let error = parse("a\n# x\nb\na slots=2\n").unwrap_err();
        assert!(matches!(
            error,
            HostfileError::DuplicateHost {
                line: 4,
                first_line: 1,
                ..
            }
        ));
        assert_eq!(
            error.to_string(),
            "hostfile hosts.txt line 4: host \"a\" is already listed on line 1 (list each host once)"
        );
        assert!(matches!(
            parse("# nothing\n\n"),
            Err(HostfileError::NoHosts { .. })
        ));
    }

    #[test]
    fn unreadable_hostfile_names_path_and_os_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-hosts");
        let error = read_hostfile(&path).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("missing-hosts"), "{message}");
        assert!(message.contains("os error"), "{message}");
    }

    #[test]
    fn read_hostfile_reads_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hostfile");
        std::fs::write(&path, "n1 slots=2\nn2 slots=2\n").unwrap();
        assert_eq!(read_hostfile(&path).unwrap().len(), 2);
    }

    #[test]
    fn include_keeps_named_hosts_in_list_order() {
        let nodes = filter_nodes(four_by_four(), Some("w2@w0:1,0"), None).unwrap();
        assert_eq!(
            nodes,
            [
                node("w0", Slots::Devices(vec![0, 1])),
                node("w2", Slots::Count(4))
            ]
        );
    }

    #[test]
    fn exclude_removes_hosts_or_slots() {
        let nodes = filter_nodes(four_by_four(), None, Some("w1@w3:0,2")).unwrap();
        assert_eq!(
            nodes,
            [
                node("w0", Slots::Count(4)),
                node("w2", Slots::Count(4)),
                node("w3", Slots::Devices(vec![1, 3]))
            ]
        );
        // A host left with no slot is dropped, as DeepSpeed does.
        let nodes = filter_nodes(four_by_four(), None, Some("w0:0,1,2,3")).unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].host, "w1");
    }

    #[test]
    fn filters_on_device_lists_use_device_indices() {
        let nodes = vec![node("g", Slots::Devices(vec![0, 1, 4, 5]))];
        assert_eq!(
            filter_nodes(nodes.clone(), Some("g:5,4"), None).unwrap(),
            [node("g", Slots::Devices(vec![4, 5]))]
        );
        assert_eq!(
            filter_nodes(nodes.clone(), None, Some("g:1")).unwrap(),
            [node("g", Slots::Devices(vec![0, 4, 5]))]
        );
        assert!(matches!(
            filter_nodes(nodes, Some("g:2"), None),
            Err(FilterError::UnknownSlot { slot: 2, .. })
        ));
    }

    #[test]
    fn unknown_slots_include_gives_devices_exclude_is_an_error() {
        let nodes = vec![node("a", Slots::Unknown), node("b", Slots::Unknown)];
        assert_eq!(
            filter_nodes(nodes.clone(), Some("a:0,3"), None).unwrap(),
            [node("a", Slots::Devices(vec![0, 3]))]
        );
        assert_eq!(
            filter_nodes(nodes.clone(), None, Some("a")).unwrap(),
            [node("b", Slots::Unknown)]
        );
        let error = filter_nodes(nodes, None, Some("a:0")).unwrap_err();
        assert_eq!(
            error,
            FilterError::UnknownSlotCount {
                mode: FilterMode::Exclude,
                host: "a".into()
            }
        );
        assert!(error.to_string().contains("slot count is unknown"));
    }

    #[test]
    fn filter_errors() {
        assert_eq!(
            filter_nodes(four_by_four(), Some("w0"), Some("w1")),
            Err(FilterError::BothGiven)
        );
        let error = filter_nodes(four_by_four(), Some("w9"), None).unwrap_err();
        assert!(matches!(error, FilterError::UnknownHost { ref host, .. } if host == "w9"));
        assert_eq!(
            error.to_string(),
            "--include: host \"w9\" is not in the node list (listed: w0, w1, w2, w3) \
             (name a listed host)"
        );
        let error = filter_nodes(four_by_four(), None, Some("w0:4")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--exclude: host \"w0\" has no slot 4 (its slots are 0,1,2,3) (name slots the host has)"
        );
        assert!(matches!(
            filter_nodes(four_by_four(), Some("w0:a"), None),
            Err(FilterError::BadSlot { .. })
        ));
        assert!(matches!(
            filter_nodes(four_by_four(), Some("w0:"), None),
            Err(FilterError::BadSlot { .. })
        ));
        assert!(matches!(
            filter_nodes(four_by_four(), Some("w0@@w1"), None),
            Err(FilterError::EmptyHost { .. })
        ));
        assert!(matches!(
            filter_nodes(four_by_four(), Some(":0"), None),
            Err(FilterError::EmptyHost { .. })
        ));
        assert!(matches!(
            filter_nodes(four_by_four(), Some("w0:0:1"), None),
            Err(FilterError::ExtraColon { .. })
        ));
        assert!(matches!(
            filter_nodes(four_by_four(), Some("w0:0@w0:1"), None),
            Err(FilterError::RepeatedHost { .. })
        ));
        assert!(matches!(
            filter_nodes(four_by_four(), None, Some("w0@w1@w2@w3")),
            Err(FilterError::NothingLeft { .. })
        ));
    }

    #[test]
    fn empty_filters_change_nothing() {
        assert_eq!(
            filter_nodes(four_by_four(), Some(""), Some(" ")).unwrap(),
            four_by_four()
        );
        assert_eq!(
            filter_nodes(four_by_four(), None, None).unwrap(),
            four_by_four()
        );
    }
}
