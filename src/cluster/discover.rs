//! Node discovery: Slurm, then PBS, then `--hostfile`, then `--hosts`, else this machine.
//!
//! Owns: deciding which source names the nodes, reading it, rejecting duplicate hosts and
//! empty lists, and applying `--include`/`--exclude`. Reads only the [`Environment`] it is
//! given (never the process environment), so tests pass their own variables.
//!
//! Precedence, first match wins:
//! 1. Slurm: `SLURM_JOB_NODELIST`, else `SLURM_NODELIST` (a hostlist expression). The
//!    expanded count is checked against `SLURM_JOB_NUM_NODES` (for `SLURM_JOB_NODELIST`,
//!    when set) or `SLURM_NNODES`. Slots on every node come from `SLURM_GPUS_ON_NODE`
//!    (a count), else `SLURM_JOB_GPUS` (device indices, `0,1` or `0-3`); Slurm only tells
//!    us about the node we run on, so nodes are taken to be alike. Job id: `SLURM_JOB_ID`.
//! 2. PBS: the file named by `PBS_NODEFILE`, one line per slot; hosts deduplicated in
//!    first-seen order, slots = that host's line count. Job id: `PBS_JOBID`.
//! 3. `--hostfile FILE` (DeepSpeed format, see [`super::hostfile`]).
//! 4. `--hosts a,b,c` (a hostlist expression, so `gpu[01-04]` works too).
//! 5. `local_host` alone, slots unknown.
//!
//! An empty variable counts as unset. When a scheduler's variables win over an explicit
//! `--hostfile`/`--hosts`, the result carries a warning saying so.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::hostfile::{self, FilterError, HostfileError};
use super::hostlist::{self, HostlistError};
use super::{host_name_problem, shown_host, ClusterSpec, Node, NodeSource, Slots};
use super::{MAX_NODES, MAX_SLOTS};

/// A snapshot of the environment variables discovery reads, so tests can pass their own.
pub type Environment = BTreeMap<String, String>;

/// What the user asked for on the command line.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryRequest {
    pub hostfile: Option<PathBuf>,
    pub hosts: Option<String>,
    pub include: Option<String>,
    pub exclude: Option<String>,
    /// `--cluster` was given: when no allocation is found its nodes are the nodes, so
    /// `--include`/`--exclude` wait for them ([`Discovery::deferred_filter`]) instead of
    /// filtering this machine.
    pub cluster_file: bool,
}

/// `--include`/`--exclude` as written, to apply once the nodes are known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterRequest {
    pub include: Option<String>,
    pub exclude: Option<String>,
}

impl FilterRequest {
    /// The filter applied to `nodes`.
    pub fn apply(&self, nodes: Vec<Node>) -> Result<Vec<Node>, FilterError> {
        hostfile::filter_nodes(nodes, self.include.as_deref(), self.exclude.as_deref())
    }
}

/// What [`discover`] found: the nodes, and warnings for the user (e.g. an explicit
/// `--hostfile` that a Slurm allocation overrode). Warnings are one line each, without a
/// `warning:` prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discovery {
    pub spec: ClusterSpec,
    pub warnings: Vec<String>,
    /// The filter still to apply: set when no allocation was found and a cluster file
    /// names the nodes ([`super::allocate`] applies it to the file's nodes).
    #[serde(skip)]
    pub deferred_filter: Option<FilterRequest>,
}

/// Why the node list could not be found.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// A hostlist expression (`SLURM_JOB_NODELIST`, `--hosts`) does not parse.
    #[error("{origin} value \"{list}\": {problem}")]
    Hostlist {
        /// The variable or flag that held the list.
        origin: String,
        list: String,
        problem: HostlistError,
    },
    #[error(
        "{list_variable} lists {listed} node{plural} but {count_variable}={count} \
         (the allocation's variables disagree: check the job's environment)",
        plural = if *.listed == 1 { "" } else { "s" }
    )]
    NodeCountMismatch {
        list_variable: String,
        listed: usize,
        count_variable: String,
        count: String,
    },
    /// A scheduler variable holds something unusable (`SLURM_NNODES=four`).
    #[error("{variable}=\"{value}\": {problem} ({hint})")]
    BadVariable {
        variable: String,
        value: String,
        problem: String,
        hint: String,
    },
    #[error(
        "cannot read PBS node file {path} (named by PBS_NODEFILE): {error} \
         (check that the file exists and is readable on this machine)",
        path = .path.display()
    )]
    UnreadableNodefile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "PBS node file {path} line {line}: \"{text}\" is not a host name \
         (the file named by PBS_NODEFILE should hold one host name per line)",
        path = .path.display()
    )]
    BadNodefileLine {
        path: PathBuf,
        line: usize,
        text: String,
    },
    #[error(transparent)]
    Hostfile(#[from] HostfileError),
    #[error("host \"{host}\" is listed twice in {origin} (list each host once)")]
    DuplicateHost { host: String, origin: String },
    #[error("{origin} lists no hosts (give at least one host)")]
    NoNodes { origin: String },
    #[error("this machine's host name is empty (name the nodes with --hosts or --hostfile)")]
    NoLocalHost,
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error(
        "SLURM_JOB_ID={job} is set but SLURM_JOB_NODELIST and SLURM_NODELIST are empty, so the \
         job's nodes are unknown (run inside the allocation's batch script or srun step, or \
         unset SLURM_JOB_ID to name the nodes with --hosts or --hostfile)"
    )]
    SlurmWithoutNodes { job: String },
    #[error(
        "{origin}: host \"{host}\" {problem} (write the name the launcher reaches the node by)"
    )]
    UnusableHostName {
        origin: String,
        host: String,
        problem: String,
    },
    #[error("{origin} lists more than {limit} hosts, more than any cluster has (check the list)")]
    TooManyNodes { origin: String, limit: usize },
    /// A Slurm step with more tasks than nodes (see [`super::copies`]).
    #[error(
        "this Slurm step runs {tasks} tasks on {nodes} node{plural}, but pipette-run runs once \
         per node and starts the processes of every GPU itself (write the step as `{line}`)",
        plural = if *.nodes == 1 { "" } else { "s" }
    )]
    TasksPerNode {
        tasks: u32,
        nodes: u32,
        line: String,
    },
}

const SLURM_LIST_VARIABLES: [&str; 2] = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"];

/// Finds the allocated nodes (see the module doc for the order of precedence), then
/// applies `--include`/`--exclude`.
pub fn discover(
    request: &DiscoveryRequest,
    env: &Environment,
    local_host: &str,
) -> Result<Discovery, DiscoveryError> {
    let mut warnings = Vec::new();
    let slurm = SLURM_LIST_VARIABLES
        .iter()
        .find_map(|&name| variable(env, name).map(|value| (name, value)));
    let pbs = variable(env, "PBS_NODEFILE");
    if slurm.is_none() {
        // Inside a Slurm job the node list is always set; without it this machine is not
        // the job's whole allocation, and running there alone would be a silent mistake.
        let job = variable(env, "SLURM_JOB_ID").or_else(|| variable(env, "SLURM_JOBID"));
        if let (Some(job), None) = (job, pbs) {
            if request.hostfile.is_none() && request.hosts.is_none() {
                return Err(DiscoveryError::SlurmWithoutNodes {
                    job: job.to_string(),
                });
            }
        }
    }

    let (nodes, source, job_id) = if let Some((list_variable, list)) = slurm {
        warn_ignored(&mut warnings, request, list_variable, true);
        if let Some(path) = pbs {
            warnings.push(format!(
                "PBS_NODEFILE={path} is ignored: {list_variable} names the nodes \
                 (Slurm's variables come first)"
            ));
        }
        let nodes = slurm_nodes(env, list_variable, list, &mut warnings)?;
        let job_id = match variable(env, "SLURM_JOB_ID") {
            Some(_) => job_id(env, "SLURM_JOB_ID")?,
            None => job_id(env, "SLURM_JOBID")?,
        };
        let source = NodeSource::Slurm {
            variable: list_variable.to_string(),
        };
        (nodes, source, job_id)
    } else if let Some(path) = pbs {
        warn_ignored(&mut warnings, request, "PBS_NODEFILE", true);
        let nodes = pbs_nodes(PathBuf::from(path))?;
        let source = NodeSource::Pbs {
            path: path.to_string(),
        };
        (nodes, source, job_id(env, "PBS_JOBID")?)
    } else if let Some(path) = &request.hostfile {
        warn_ignored(&mut warnings, request, "--hostfile", false);
        let nodes = hostfile::read_hostfile(path)?;
        let source = NodeSource::Hostfile {
            path: path.display().to_string(),
        };
        (nodes, source, None)
    } else if let Some(list) = &request.hosts {
        let nodes = listed_nodes("--hosts", list, Slots::Unknown)?;
        (nodes, NodeSource::Hosts, None)
    } else {
        let host = local_host.trim();
        if host.is_empty() {
            return Err(DiscoveryError::NoLocalHost);
        }
        let node = Node {
            host: host.to_string(),
            slots: Slots::Unknown,
        };
        (vec![node], NodeSource::Local, None)
    };

    let filter = FilterRequest {
        include: request.include.clone(),
        exclude: request.exclude.clone(),
    };
    let deferred = source == NodeSource::Local && request.cluster_file;
    let (nodes, deferred_filter) = match deferred {
        true => (nodes, Some(filter)),
        false => (filter.apply(nodes)?, None),
    };
    Ok(Discovery {
        spec: ClusterSpec {
            nodes,
            source,
            job_id: job_id.map(str::to_string),
        },
        warnings,
        deferred_filter,
    })
}

/// A variable's value, with unset and empty (or blank) treated alike.
/// The scheduler's job id in `name`: it becomes the rendezvous id, printed and written
/// into every launch script, so a blank, control or format character in it is refused.
fn job_id<'a>(env: &'a Environment, name: &str) -> Result<Option<&'a str>, DiscoveryError> {
    match variable(env, name) {
        Some(id)
            if id
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || crate::log::is_format_char(c)) =>
        {
            Err(DiscoveryError::BadVariable {
                variable: name.to_string(),
                value: shown_host(id),
                problem: "holds a blank, control or invisible character".to_string(),
                hint: "a job id is a word such as 4242 or 12.server; check the job's environment"
                    .to_string(),
            })
        }
        id => Ok(id),
    }
}

fn variable<'a>(env: &'a Environment, name: &str) -> Option<&'a str> {
    env.get(name)
        .map(|value| value.trim())
        .filter(|value| !value.is_empty())
}

/// Warns about `--hostfile`/`--hosts` when a source of higher precedence (`winner`) is used.
fn warn_ignored(
    warnings: &mut Vec<String>,
    request: &DiscoveryRequest,
    winner: &str,
    scheduler: bool,
) {
    let hint = if scheduler {
        format!("the scheduler's allocation comes first; unset {winner} to use it")
    } else {
        "give only one of them".to_string()
    };
    if scheduler {
        if let Some(path) = &request.hostfile {
            warnings.push(format!(
                "--hostfile {} is ignored: {winner} names the nodes ({hint})",
                path.display()
            ));
        }
    }
    if let Some(hosts) = &request.hosts {
        warnings.push(format!(
            "--hosts \"{hosts}\" is ignored: {winner} names the nodes ({hint})"
        ));
    }
}

/// Expands a hostlist from `origin` into nodes with the same slots, rejecting duplicates.
fn listed_nodes(origin: &str, list: &str, slots: Slots) -> Result<Vec<Node>, DiscoveryError> {
    let hosts = hostlist::expand(list).map_err(|problem| DiscoveryError::Hostlist {
        origin: origin.to_string(),
        list: shown_host(list),
        problem,
    })?;
    reject_duplicates(&hosts, origin)?;
    Ok(hosts
        .into_iter()
        .map(|host| Node {
            host,
            slots: slots.clone(),
        })
        .collect())
}

fn reject_duplicates(hosts: &[String], origin: &str) -> Result<(), DiscoveryError> {
    let mut seen = HashMap::with_capacity(hosts.len());
    for host in hosts {
        check_host_name(origin, host)?;
        if seen.insert(super::host_key(host), ()).is_some() {
            return Err(DiscoveryError::DuplicateHost {
                host: host.clone(),
                origin: origin.to_string(),
            });
        }
    }
    Ok(())
}

fn check_host_name(origin: &str, host: &str) -> Result<(), DiscoveryError> {
    match host_name_problem(host) {
        None => Ok(()),
        Some(problem) => Err(DiscoveryError::UnusableHostName {
            origin: origin.to_string(),
            host: shown_host(host),
            problem,
        }),
    }
}

fn slurm_nodes(
    env: &Environment,
    list_variable: &str,
    list: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<Node>, DiscoveryError> {
    let slots = slurm_slots(env, list_variable, warnings)?;
    let nodes = listed_nodes(list_variable, list, slots)?;

    // Inside an `srun` step SLURM_NNODES counts the step's nodes while SLURM_JOB_NODELIST
    // lists the job's, so the job list is checked against the job count when Slurm set it.
    let count_variable = match variable(env, "SLURM_JOB_NUM_NODES") {
        Some(_) if list_variable == "SLURM_JOB_NODELIST" => "SLURM_JOB_NUM_NODES",
        _ => "SLURM_NNODES",
    };
    if let Some(count) = variable(env, count_variable) {
        let expected = parse_count(count_variable, count)?;
        if usize::try_from(expected).ok() != Some(nodes.len()) {
            return Err(DiscoveryError::NodeCountMismatch {
                list_variable: list_variable.to_string(),
                listed: nodes.len(),
                count_variable: count_variable.to_string(),
                count: count.to_string(),
            });
        }
    }
    Ok(nodes)
}

/// The slots Slurm gives each node. `SLURM_GPUS_ON_NODE` wins over `SLURM_JOB_GPUS`
/// because the latter holds the node's physical indices, which are not what
/// `CUDA_VISIBLE_DEVICES` means inside a job whose devices are constrained by cgroups.
fn slurm_slots(
    env: &Environment,
    list_variable: &str,
    warnings: &mut Vec<String>,
) -> Result<Slots, DiscoveryError> {
    if let Some(value) = variable(env, "SLURM_GPUS_ON_NODE") {
        return match parse_count("SLURM_GPUS_ON_NODE", value)? {
            0 => {
                warnings.push(format!(
                    "SLURM_GPUS_ON_NODE=0: the nodes of {list_variable} have no GPUs allocated, \
                     so their slot count is left unknown (ask Slurm for GPUs, e.g. --gpus-per-node)"
                ));
                Ok(Slots::Unknown)
            }
            n => Ok(Slots::Count(n)),
        };
    }
    let Some(value) = variable(env, "SLURM_JOB_GPUS") else {
        return Ok(Slots::Unknown);
    };
    let bad = |problem: String| DiscoveryError::BadVariable {
        variable: "SLURM_JOB_GPUS".to_string(),
        value: value.to_string(),
        problem,
        hint: "expected device indices such as 0,1,2,3 or 0-3".to_string(),
    };
    let indices = hostlist::expand_ranges(value).map_err(|e| bad(e.to_string()))?;
    let mut devices: Vec<u32> = Vec::with_capacity(indices.len());
    for index in indices {
        let device =
            u32::try_from(index).map_err(|_| bad(format!("device index {index} is too large")))?;
        if devices.contains(&device) {
            return Err(bad(format!("device {device} is listed twice")));
        }
        devices.push(device);
    }
    Ok(Slots::Devices(devices))
}

fn parse_count(name: &str, value: &str) -> Result<u32, DiscoveryError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| DiscoveryError::BadVariable {
            variable: name.to_string(),
            value: value.to_string(),
            problem: "not a whole number".to_string(),
            hint: "expected a count such as 4; check the job's environment".to_string(),
        })
}

/// Reads a PBS node file: one line per slot, so a host's line count is its slot count.
fn pbs_nodes(path: PathBuf) -> Result<Vec<Node>, DiscoveryError> {
    let text = match crate::input_file::read_to_string(&path) {
        Ok(text) => text,
        Err(error) => return Err(DiscoveryError::UnreadableNodefile { path, error }),
    };
    let mut nodes: Vec<Node> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let origin = || format!("PBS node file {} (named by PBS_NODEFILE)", path.display());
    for (number, line) in text.lines().enumerate() {
        let host = line.trim();
        if host.is_empty() {
            continue;
        }
        if host.contains(char::is_whitespace) {
            return Err(DiscoveryError::BadNodefileLine {
                path,
                line: number + 1,
                text: shown_host(host),
            });
        }
        check_host_name(&format!("{} line {}", origin(), number + 1), host)?;
        match index.get(&super::host_key(host)) {
            Some(&at) => {
                // Past MAX_SLOTS lines a host's count is only ever compared with its GPUs.
                if let Slots::Count(n) = &mut nodes[at].slots {
                    *n = n.saturating_add(1).min(MAX_SLOTS + 1);
                }
            }
            None if nodes.len() == MAX_NODES => {
                return Err(DiscoveryError::TooManyNodes {
                    origin: origin(),
                    limit: MAX_NODES,
                })
            }
            None => {
                index.insert(super::host_key(host), nodes.len());
                nodes.push(Node {
                    host: host.to_string(),
                    slots: Slots::Count(1),
                });
            }
        }
    }
    if nodes.is_empty() {
        return Err(DiscoveryError::NoNodes { origin: origin() });
    }
    Ok(nodes)
}

/// An environment of these variables, for tests.
#[cfg(test)]
pub(crate) fn environment(pairs: &[(&str, &str)]) -> Environment {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::environment as env;
    use super::*;
    use std::path::Path;

    fn node(host: &str, slots: Slots) -> Node {
        Node {
            host: host.to_string(),
            slots,
        }
    }

    fn hosts(discovery: &Discovery) -> Vec<&str> {
        discovery
            .spec
            .nodes
            .iter()
            .map(|n| n.host.as_str())
            .collect()
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn run(request: &DiscoveryRequest, env: &Environment) -> Result<Discovery, DiscoveryError> {
        discover(request, env, "here")
    }

    #[test]
    fn nothing_found_means_this_machine_alone() {
        let found = run(&DiscoveryRequest::default(), &env(&[])).unwrap();
        assert_eq!(found.spec.nodes, [node("here", Slots::Unknown)]);
        assert_eq!(found.spec.source, NodeSource::Local);
        assert_eq!(found.spec.job_id, None);
        assert!(found.warnings.is_empty());
        assert!(matches!(
            discover(&DiscoveryRequest::default(), &env(&[]), " "),
            Err(DiscoveryError::NoLocalHost)
        ));
    }

    #[test]
    fn slurm_job_nodelist_with_gpu_count_and_job_id() {
        let vars = env(&[
            ("SLURM_JOB_NODELIST", "gpu[001-002],gpu-b1"),
            ("SLURM_NODELIST", "other"),
            ("SLURM_NNODES", "3"),
            ("SLURM_GPUS_ON_NODE", "8"),
            ("SLURM_JOB_GPUS", "0,1,2,3,4,5,6,7"),
            ("SLURM_JOB_ID", "4242"),
        ]);
        let found = run(&DiscoveryRequest::default(), &vars).unwrap();
        assert_eq!(
            found.spec,
            ClusterSpec {
                nodes: vec![
                    node("gpu001", Slots::Count(8)),
                    node("gpu002", Slots::Count(8)),
                    node("gpu-b1", Slots::Count(8)),
                ],
                source: NodeSource::Slurm {
                    variable: "SLURM_JOB_NODELIST".into()
                },
                job_id: Some("4242".into()),
            }
        );
        assert!(found.warnings.is_empty());
    }

    #[test]
    fn slurm_nodelist_is_the_fallback_and_job_gpus_give_devices() {
        let vars = env(&[
            ("SLURM_JOB_NODELIST", ""),
            ("SLURM_NODELIST", "n[1-2]"),
            ("SLURM_JOB_GPUS", "0-1,4,5"),
            ("SLURM_JOBID", "7"),
        ]);
        let found = run(&DiscoveryRequest::default(), &vars).unwrap();
        assert_eq!(
            found.spec.source,
            NodeSource::Slurm {
                variable: "SLURM_NODELIST".into()
            }
        );
        assert_eq!(
            found.spec.nodes,
            [
                node("n1", Slots::Devices(vec![0, 1, 4, 5])),
                node("n2", Slots::Devices(vec![0, 1, 4, 5]))
            ]
        );
        assert_eq!(found.spec.job_id.as_deref(), Some("7"));
    }

    #[test]
    fn slurm_without_gpu_variables_has_unknown_slots() {
        let vars = env(&[("SLURM_JOB_NODELIST", "a,b")]);
        let found = run(&DiscoveryRequest::default(), &vars).unwrap();
        assert!(found.spec.nodes.iter().all(|n| n.slots == Slots::Unknown));
        let vars = env(&[("SLURM_JOB_NODELIST", "a"), ("SLURM_GPUS_ON_NODE", "0")]);
        let found = run(&DiscoveryRequest::default(), &vars).unwrap();
        assert_eq!(found.spec.nodes, [node("a", Slots::Unknown)]);
        assert_eq!(found.warnings.len(), 1);
    }

    #[test]
    fn slurm_node_count_mismatch_names_both_variables() {
        let vars = env(&[("SLURM_JOB_NODELIST", "n[1-3]"), ("SLURM_NNODES", "4")]);
        let error = run(&DiscoveryRequest::default(), &vars).unwrap_err();
        assert_eq!(
            error.to_string(),
            "SLURM_JOB_NODELIST lists 3 nodes but SLURM_NNODES=4 \
             (the allocation's variables disagree: check the job's environment)"
        );
        // Inside a one-node step of a three-node job: the job count is the one to check.
        let vars = env(&[
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_JOB_NUM_NODES", "3"),
            ("SLURM_NNODES", "1"),
        ]);
        assert_eq!(
            run(&DiscoveryRequest::default(), &vars)
                .unwrap()
                .spec
                .nodes
                .len(),
            3
        );
        let vars = env(&[("SLURM_NODELIST", "n[1-3]"), ("SLURM_NNODES", "three")]);
        assert!(matches!(
            run(&DiscoveryRequest::default(), &vars),
            Err(DiscoveryError::BadVariable { ref variable, .. }) if variable == "SLURM_NNODES"
        ));
    }

    #[test]
    fn slurm_variable_errors() {
        let vars = env(&[("SLURM_JOB_NODELIST", "gpu[5-2]")]);
        let error = run(&DiscoveryRequest::default(), &vars).unwrap_err();
        assert_eq!(
            error.to_string(),
            "SLURM_JOB_NODELIST value \"gpu[5-2]\": range \"5-2\" at column 5 in \"gpu[5-2]\" \
             is descending (write the lower bound first, e.g. [2-5])"
        );
        for (name, value) in [
            ("SLURM_GPUS_ON_NODE", "eight"),
            ("SLURM_JOB_GPUS", "0,x"),
            ("SLURM_JOB_GPUS", "0,0"),
            ("SLURM_JOB_GPUS", "4294967296"),
        ] {
            let vars = env(&[("SLURM_JOB_NODELIST", "a"), (name, value)]);
            match run(&DiscoveryRequest::default(), &vars) {
                Err(DiscoveryError::BadVariable { variable, .. }) => assert_eq!(variable, name),
                other => panic!("{name}={value}: {other:?}"),
            }
        }
        let vars = env(&[("SLURM_JOB_NODELIST", "a,b,a")]);
        let error = run(&DiscoveryRequest::default(), &vars).unwrap_err();
        assert_eq!(
            error.to_string(),
            "host \"a\" is listed twice in SLURM_JOB_NODELIST (list each host once)"
        );
        let vars = env(&[("SLURM_JOB_NODELIST", "n[1-2,2]")]);
        assert!(matches!(
            run(&DiscoveryRequest::default(), &vars),
            Err(DiscoveryError::DuplicateHost { ref host, .. }) if host == "n2"
        ));
    }

    #[test]
    fn slurm_wins_over_explicit_options_with_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let hostfile = write(dir.path(), "hostfile", "x slots=1\n");
        let pbs = write(dir.path(), "pbs", "p\n");
        let request = DiscoveryRequest {
            hostfile: Some(hostfile),
            hosts: Some("y,z".into()),
            ..Default::default()
        };
        let vars = env(&[
            ("SLURM_JOB_NODELIST", "s1"),
            ("PBS_NODEFILE", pbs.to_str().unwrap()),
        ]);
        let found = run(&request, &vars).unwrap();
        assert_eq!(hosts(&found), ["s1"]);
        assert_eq!(found.warnings.len(), 3, "{:?}", found.warnings);
        assert!(found.warnings[0].starts_with("--hostfile "));
        assert!(found.warnings[0].contains("SLURM_JOB_NODELIST"));
        assert!(found.warnings[1].starts_with("--hosts \"y,z\" is ignored"));
        assert!(found.warnings[2].starts_with("PBS_NODEFILE="));
    }

    #[test]
    fn pbs_nodefile_is_deduplicated_in_first_seen_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "nodes", "b\nb\na\n\nb\na\nc\n");
        let request = DiscoveryRequest {
            hosts: Some("y".into()),
            ..Default::default()
        };
        let vars = env(&[
            ("PBS_NODEFILE", path.to_str().unwrap()),
            ("PBS_JOBID", "12.server"),
        ]);
        let found = run(&request, &vars).unwrap();
        assert_eq!(
            found.spec,
            ClusterSpec {
                nodes: vec![
                    node("b", Slots::Count(3)),
                    node("a", Slots::Count(2)),
                    node("c", Slots::Count(1)),
                ],
                source: NodeSource::Pbs {
                    path: path.to_str().unwrap().into()
                },
                job_id: Some("12.server".into()),
            }
        );
        assert_eq!(found.warnings.len(), 1);
        assert!(found.warnings[0].contains("PBS_NODEFILE"));
    }

    #[test]
    fn pbs_nodefile_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gone");
        let vars = env(&[("PBS_NODEFILE", missing.to_str().unwrap())]);
        let message = run(&DiscoveryRequest::default(), &vars)
            .unwrap_err()
            .to_string();
        assert!(message.contains("gone"), "{message}");
        assert!(message.contains("os error"), "{message}");
        let empty = write(dir.path(), "empty", "\n\n");
        let vars = env(&[("PBS_NODEFILE", empty.to_str().unwrap())]);
        assert!(matches!(
            run(&DiscoveryRequest::default(), &vars),
            Err(DiscoveryError::NoNodes { .. })
        ));
        let bad = write(dir.path(), "bad", "a\na b\n");
        let vars = env(&[("PBS_NODEFILE", bad.to_str().unwrap())]);
        assert!(matches!(
            run(&DiscoveryRequest::default(), &vars),
            Err(DiscoveryError::BadNodefileLine { line: 2, .. })
        ));
    }

    #[test]
    fn hostfile_wins_over_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "hostfile",
            "# two nodes\nw0 slots=8\nw1 slots=8 # spare\n",
        );
        let request = DiscoveryRequest {
            hostfile: Some(path.clone()),
            hosts: Some("y".into()),
            ..Default::default()
        };
        let found = run(&request, &env(&[])).unwrap();
        assert_eq!(
            found.spec.nodes,
            [node("w0", Slots::Count(8)), node("w1", Slots::Count(8))]
        );
        assert_eq!(
            found.spec.source,
            NodeSource::Hostfile {
                path: path.display().to_string()
            }
        );
        assert_eq!(found.warnings.len(), 1);
        assert!(found.warnings[0].contains("give only one of them"));
    }

    #[test]
    fn hostfile_errors_pass_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "hosts.txt", "a slots=8\nb slots=8\na slots=8\n");
        let request = DiscoveryRequest {
            hostfile: Some(path),
            ..Default::default()
        };
        let error = run(&request, &env(&[])).unwrap_err();
        assert!(matches!(
            error,
            DiscoveryError::Hostfile(HostfileError::DuplicateHost { line: 3, .. })
        ));
        let request = DiscoveryRequest {
            hostfile: Some(dir.path().join("nope")),
            ..Default::default()
        };
        assert!(matches!(
            run(&request, &env(&[])),
            Err(DiscoveryError::Hostfile(HostfileError::Unreadable { .. }))
        ));
    }

    #[test]
    fn hosts_accept_commas_and_hostlist_expressions() {
        let request = DiscoveryRequest {
            hosts: Some("a,gpu[01-02]".into()),
            ..Default::default()
        };
        let found = run(&request, &env(&[])).unwrap();
        assert_eq!(hosts(&found), ["a", "gpu01", "gpu02"]);
        assert_eq!(found.spec.source, NodeSource::Hosts);
        assert!(found.spec.nodes.iter().all(|n| n.slots == Slots::Unknown));

        for (list, duplicate) in [("a,b,a", "a"), ("n[1-2],n1", "n1")] {
            let request = DiscoveryRequest {
                hosts: Some(list.into()),
                ..Default::default()
            };
            match run(&request, &env(&[])) {
                Err(DiscoveryError::DuplicateHost { host, origin }) => {
                    assert_eq!(host, duplicate);
                    assert_eq!(origin, "--hosts");
                }
                other => panic!("{list}: {other:?}"),
            }
        }
        let request = DiscoveryRequest {
            hosts: Some(String::new()),
            ..Default::default()
        };
        assert!(matches!(
            run(&request, &env(&[])),
            Err(DiscoveryError::Hostlist {
                problem: HostlistError::Empty,
                ..
            })
        ));
    }

    #[test]
    fn filters_apply_to_every_source() {
        let vars = env(&[
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_GPUS_ON_NODE", "4"),
        ]);
        let request = DiscoveryRequest {
            exclude: Some("n2@n3:0,1".into()),
            ..Default::default()
        };
        let found = run(&request, &vars).unwrap();
        assert_eq!(
            found.spec.nodes,
            [
                node("n1", Slots::Count(4)),
                node("n3", Slots::Devices(vec![2, 3]))
            ]
        );
        let request = DiscoveryRequest {
            hosts: Some("a,b,c".into()),
            include: Some("c@a:1".into()),
            ..Default::default()
        };
        let found = run(&request, &env(&[])).unwrap();
        assert_eq!(
            found.spec.nodes,
            [
                node("a", Slots::Devices(vec![1])),
                node("c", Slots::Unknown)
            ]
        );
        let request = DiscoveryRequest {
            include: Some("here".into()),
            exclude: Some("here".into()),
            ..Default::default()
        };
        assert!(matches!(
            run(&request, &env(&[])),
            Err(DiscoveryError::Filter(FilterError::BothGiven))
        ));
        let request = DiscoveryRequest {
            exclude: Some("here".into()),
            ..Default::default()
        };
        assert!(matches!(
            run(&request, &env(&[])),
            Err(DiscoveryError::Filter(FilterError::NothingLeft { .. }))
        ));
    }

    #[test]
    fn every_message_is_one_line_lowercase_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let cases: Vec<(DiscoveryRequest, Environment)> = vec![
            (
                DiscoveryRequest::default(),
                env(&[("SLURM_JOB_NODELIST", "a[")]),
            ),
            (
                DiscoveryRequest::default(),
                env(&[("SLURM_JOB_NODELIST", "a"), ("SLURM_NNODES", "2")]),
            ),
            (
                DiscoveryRequest::default(),
                env(&[("SLURM_JOB_NODELIST", "a"), ("SLURM_JOB_GPUS", "x")]),
            ),
            (
                DiscoveryRequest::default(),
                env(&[("PBS_NODEFILE", dir.path().join("no").to_str().unwrap())]),
            ),
            (
                DiscoveryRequest {
                    hostfile: Some(dir.path().join("no")),
                    ..Default::default()
                },
                env(&[]),
            ),
            (
                DiscoveryRequest {
                    hosts: Some("a,a".into()),
                    ..Default::default()
                },
                env(&[]),
            ),
            (
                DiscoveryRequest {
                    include: Some("zz".into()),
                    ..Default::default()
                },
                env(&[]),
            ),
        ];
        for (request, vars) in cases {
            let message = run(&request, &vars).unwrap_err().to_string();
            assert!(!message.contains('\n'), "{message}");
            assert!(message.ends_with(')'), "{message}");
            // Lowercase, unless it starts by naming a variable (SLURM_NNODES, ...).
            let first_word = message.split([' ', '=']).next().unwrap_or_default();
            let is_variable = first_word
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_');
            assert!(
                is_variable || !message.starts_with(char::is_uppercase),
                "{message}"
            );
        }
    }

    /// `SLURM_JOB_ID` with an empty `SLURM_JOB_NODELIST` fell back to this machine.
    #[test]
    fn defect_13_a_slurm_job_without_a_node_list_is_an_error() {
        let vars = env(&[("SLURM_JOB_ID", "981"), ("SLURM_JOB_NODELIST", "")]);
        let e = run(&DiscoveryRequest::default(), &vars).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, DiscoveryError::SlurmWithoutNodes { .. }),
            "{text}"
        );
        assert!(
            text.starts_with("SLURM_JOB_ID=981 is set but SLURM_JOB_NODELIST"),
            "{text}"
        );
        assert!(text.contains("unset SLURM_JOB_ID"), "{text}");
        // Naming the nodes explicitly is what the message suggests, and works.
        let request = DiscoveryRequest {
            hosts: Some("a,b".into()),
            ..Default::default()
        };
        assert_eq!(hosts(&run(&request, &vars).unwrap()), ["a", "b"]);
    }

    /// Names given through --hosts or Slurm are held to the hostfile's rules: no control
    /// characters, at most 253 bytes, and the message never shows them raw.
    #[test]
    fn defect_09_listed_names_are_checked_and_shown_escaped() {
        let request = DiscoveryRequest {
            hosts: Some(format!("{}[10-11]", "q".repeat(252))),
            ..Default::default()
        };
        let e = run(&request, &env(&[])).unwrap_err().to_string();
        assert!(e.contains("254 bytes long"), "{e}");
        let vars = env(&[("SLURM_JOB_NODELIST", "a,b\u{1b}[2J")]);
        let e = run(&DiscoveryRequest::default(), &vars)
            .unwrap_err()
            .to_string();
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(e.contains("SLURM_JOB_NODELIST"), "{e}");
    }

    /// A listed name that ssh or srun would read as an option (`-oProxyCommand=...` runs a
    /// command) is a node-list error where the list is read. Before, it passed discovery
    /// and was refused only when a command was built for it, as an unreachable node (exit
    /// 68 instead of 66).
    #[test]
    fn a_listed_name_starting_with_a_dash_is_a_node_list_error() {
        let request = DiscoveryRequest {
            hosts: Some("a,-oProxyCommand=id".into()),
            ..Default::default()
        };
        let e = run(&request, &env(&[])).unwrap_err();
        assert!(
            matches!(e, DiscoveryError::UnusableHostName { .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("starts with '-'"), "{e}");
        let vars = env(&[("SLURM_JOB_NODELIST", "-x")]);
        let e = run(&DiscoveryRequest::default(), &vars).unwrap_err();
        assert!(e.to_string().contains("SLURM_JOB_NODELIST"), "{e}");
        assert!(e.to_string().contains("starts with '-'"), "{e}");
    }

    /// With --cluster and no allocation the filter waits for the file's nodes.
    #[test]
    fn defect_06_filters_wait_for_the_cluster_file_s_nodes() {
        let request = DiscoveryRequest {
            include: Some("a100-n00".into()),
            cluster_file: true,
            ..Default::default()
        };
        let found = run(&request, &env(&[])).unwrap();
        assert_eq!(hosts(&found), ["here"]);
        assert_eq!(
            found.deferred_filter.unwrap().include.as_deref(),
            Some("a100-n00")
        );
        // An allocation's nodes are filtered at once, cluster file or not.
        let request = DiscoveryRequest {
            hosts: Some("a,b".into()),
            include: Some("b".into()),
            cluster_file: true,
            ..Default::default()
        };
        let found = run(&request, &env(&[])).unwrap();
        assert_eq!(hosts(&found), ["b"]);
        assert_eq!(found.deferred_filter, None);
    }
}
