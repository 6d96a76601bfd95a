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

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::{host_key, host_name_problem, shown_host, Node, Slots, MAX_NODES, MAX_SLOTS};

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
        "hostfile {path} line {line}: slots={value} is more than {MAX_SLOTS} GPUs on one node, \
         which no machine has (write slots=N with N the node's GPU count)",
        path = .path.display()
    )]
    TooManySlots {
        path: PathBuf,
        line: usize,
        value: String,
    },
    #[error(
        "hostfile {path} line {line}: slots={value} is negative \
         (write slots=N with N a positive integer, at most {MAX_SLOTS})",
        path = .path.display()
    )]
    NegativeSlots {
        path: PathBuf,
        line: usize,
        value: String,
    },
    #[error(
        "hostfile {path} line {line}: host \"{host}\" {problem} \
         (write the name the launcher reaches the node by, one per line)",
        path = .path.display()
    )]
    UnusableHostName {
        path: PathBuf,
        line: usize,
        /// The name as [`shown_host`] shows it.
        host: String,
        problem: String,
    },
    #[error(
        "hostfile {path} line {line}: \"{written}\" is not a host name \
         (a hostfile gives slots as \"{host} slots={slots}\")",
        path = .path.display()
    )]
    ColonSlots {
        path: PathBuf,
        line: usize,
        written: String,
        host: String,
        slots: String,
    },
    #[error(
        "hostfile {path} lists more than {MAX_NODES} hosts, more than any cluster has \
         (check that --hostfile names a hostfile)",
        path = .path.display()
    )]
    TooManyHosts { path: PathBuf },
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
    let text =
        crate::input_file::read_to_string(path).map_err(|source| HostfileError::Unreadable {
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
    // Each host's first line: a set, so a long file is read in linear time.
    let mut first_lines: HashMap<String, usize> = HashMap::new();
    // Editors on Windows may start the file with a byte-order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split_once('#').map_or(raw, |(before, _)| before);
        let mut tokens = content.split_whitespace();
        let Some(host) = tokens.next() else {
            continue;
        };
        if let Some(problem) = host_name_problem(host) {
            return Err(HostfileError::UnusableHostName {
                path: path.to_path_buf(),
                line,
                host: shown_host(host),
                problem,
            });
        }
        if host.contains(['=', '[', ']', ',', '@']) {
            return Err(HostfileError::BadHostName {
                path: path.to_path_buf(),
                line,
                host: host.to_string(),
            });
        }
        // `localhost:2` is how some launchers give slots; here it would be taken for a
        // host named so. IPv6 addresses have two colons or more and stay names.
        if let Some((name, slots)) = host.split_once(':') {
            if !name.contains(':') && !slots.is_empty() && slots.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(HostfileError::ColonSlots {
                    path: path.to_path_buf(),
                    line,
                    written: host.to_string(),
                    host: name.to_string(),
                    slots: slots.to_string(),
                });
            }
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
        if let Some(&first_line) = first_lines.get(&host_key(host)) {
            return Err(HostfileError::DuplicateHost {
                path: path.to_path_buf(),
                line,
                host: host.to_string(),
                first_line,
            });
        }
        if nodes.len() == MAX_NODES {
            return Err(HostfileError::TooManyHosts {
                path: path.to_path_buf(),
            });
        }
        nodes.push(Node {
            host: host.to_string(),
            slots,
        });
        first_lines.insert(host_key(host), line);
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
    let digits = value.strip_prefix('-').unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if digits.len() != value.len() {
        return Err(HostfileError::NegativeSlots {
            path: path.to_path_buf(),
            line,
            value: value.to_string(),
        });
    }
    // Digits only: anything that does not parse is too large for any node.
    match value.parse::<u32>() {
        Ok(0) => Err(HostfileError::ZeroSlots {
            path: path.to_path_buf(),
            line,
        }),
        Ok(n) if n <= MAX_SLOTS => Ok(n),
        _ => Err(HostfileError::TooManySlots {
            path: path.to_path_buf(),
            line,
            value: value.to_string(),
        }),
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
    let mut named = std::collections::HashSet::new();
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
        if !named.insert(host) {
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
    let index: HashMap<String, &Node> = nodes.iter().map(|n| (host_key(&n.host), n)).collect();
    // Check every entry against the list first, so errors do not depend on order.
    for entry in &filter.entries {
        let Some(node) = index.get(&host_key(&entry.host)) else {
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
    let entries: HashMap<String, &FilterEntry> = filter
        .entries
        .iter()
        .map(|e| (host_key(&e.host), e))
        .collect();
    drop(index);
    let mut kept = Vec::new();
    for node in nodes {
        let entry = entries.get(&host_key(&node.host)).copied();
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
            Err(HostfileError::NegativeSlots { .. })
        ));
        assert!(matches!(
            parse("a slots=99999999999\n"),
            Err(HostfileError::TooManySlots { .. })
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

    /// The duplicate check compared every host with every earlier one: 100k lines took
    /// 7.6 s, 1M more than 120 s. With a set, 200k lines are one pass.
    #[test]
    fn defect_03_a_long_hostfile_is_read_in_linear_time() {
        let n = 200_000;
        let mut text: String = (0..n).map(|i| format!("node{i} slots=8\n")).collect();
        let nodes = parse(&text).unwrap();
        assert_eq!(nodes.len(), n);
        assert_eq!(nodes[n - 1], node("node199999", Slots::Count(8)));
        text.push_str("node123 slots=8\n");
        match parse(&text) {
            Err(HostfileError::DuplicateHost {
                line, first_line, ..
            }) => assert_eq!((line, first_line), (n + 1, 124)),
            other => panic!("{other:?}"),
        }
        // A filter naming every host is applied in one pass too.
        let every: Vec<String> = (0..n).step_by(2).map(|i| format!("node{i}")).collect();
        let kept = filter_nodes(nodes, Some(&every.join("@")), None).unwrap();
        assert_eq!(kept.len(), n / 2);
    }

    /// ESC, NUL and BEL in a hostfile's names were accepted and printed raw (terminal
    /// escape injection); the cluster reader refused them.
    #[test]
    fn defect_09_control_characters_in_host_names_are_refused_and_shown_escaped() {
        for name in ["a\u{1b}]0;pwned\u{7}", "b\u{0}c", "bell\u{7}"] {
            let e = parse(&format!("{name} slots=8\n")).unwrap_err().to_string();
            assert!(e.contains("control character"), "{e:?}");
            assert!(!e.chars().any(char::is_control), "shown raw: {e:?}");
            assert!(e.contains("line 1"), "{e:?}");
        }
        let long = format!("{} slots=8\n", "n".repeat(254));
        let e = parse(&long).unwrap_err().to_string();
        assert!(e.contains("254 bytes long"), "{e}");
    }

    /// `localhost:2` was taken as a host named so.
    #[test]
    fn defect_09_host_colon_slots_is_refused_with_the_spelling_to_use() {
        let e = parse("localhost:2\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "hostfile hosts.txt line 1: \"localhost:2\" is not a host name \
             (a hostfile gives slots as \"localhost slots=2\")"
        );
        // IPv6 addresses are names.
        assert_eq!(parse("fe80::1 slots=2\n").unwrap()[0].host, "fe80::1");
    }

    /// `slots=4294967297` and `slots=-1` were both "not a number".
    #[test]
    fn defect_12_slot_values_say_what_is_wrong_with_them() {
        let e = parse("a slots=4294967297\n").unwrap_err().to_string();
        assert!(e.contains("more than 1024 GPUs on one node"), "{e}");
        let e = parse("a slots=-1\n").unwrap_err().to_string();
        assert!(e.contains("slots=-1 is negative"), "{e}");
    }

    /// `slots=1000000` was accepted.
    #[test]
    fn defect_14_slots_are_capped() {
        assert_eq!(
            parse("a slots=1024\n").unwrap()[0].slots,
            Slots::Count(1024)
        );
        assert!(matches!(
            parse("a slots=1000000\n"),
            Err(HostfileError::TooManySlots { line: 1, .. })
        ));
    }
}
