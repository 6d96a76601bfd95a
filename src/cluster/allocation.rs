//! What a job may use of the nodes: which hosts, how many workers each runs, which of
//! their GPUs, and where the node list came from ([`Allocation`], made by [`allocate`]
//! from what discovery found, the cluster profile and the worker options).
//!
//! Owns `--nproc-per-node` and `--nnodes` as torchrun spells them ([`NprocPerNode`],
//! [`NodeRange`]) and the narrowing of a cluster profile to the allocation
//! ([`Allocation::narrow`]). The orchestrator, the reports and the launch all read the
//! one [`Allocation`]; none of them decides hosts or worker counts again.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::discover::Discovery;
use super::profile::{DeviceSelection, NodeSelection};
use super::{ClusterProfile, Node, NodeSource, Slots};

/// The hosts a job runs on and what each may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allocation {
    /// Where the node list came from (a cluster file when no allocation was found and the
    /// profile named the nodes).
    pub source: NodeSource,
    /// The scheduler's job id, when there is one.
    pub job_id: Option<String>,
    /// The hosts, in the order the allocation (or the user) listed them.
    pub hosts: Vec<HostAllocation>,
    /// What discovery warned about, one line each.
    pub warnings: Vec<String>,
}

/// One host of an [`Allocation`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostAllocation {
    pub host: String,
    /// Workers (one per GPU) pipette-run would start here; `null` when unknown.
    pub workers: Option<u32>,
    /// The device indices the node may use, when discovery restricted them.
    pub devices: Option<Vec<u32>>,
    /// The GPU model, from the cluster profile.
    pub gpu: Option<String>,
}

/// What decides an allocation besides the nodes found and the profile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocationRequest {
    /// `--nnodes`: the nodes found must be this many.
    pub nnodes: Option<NodeRange>,
    /// `--nproc-per-node`.
    pub nproc_per_node: Option<NprocPerNode>,
}

/// Why the nodes found cannot be allocated as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// The cluster profile lacks a host (or a GPU) the allocation includes.
    #[error("{path}: {problem}, which the allocation includes (profile the allocated nodes again, or pass a cluster file that covers them)")]
    NotInProfile { path: String, problem: String },
    /// `--nnodes` disagrees with the nodes found.
    #[error(
        "--nnodes {asked} but {} node{} found ({}) (pipette-run uses the nodes it discovers: drop --nnodes, or fix the node list)",
        .found.len(),
        if .found.len() == 1 { " was" } else { "s were" },
        .found.join(",")
    )]
    NodeCount {
        asked: NodeRange,
        found: Vec<String>,
    },
    /// `--nproc-per-node` asks for more workers than a node has GPU slots.
    #[error("--nproc-per-node {asked} but node {host} has only {have} GPU slots (lower --nproc-per-node, or leave it out to use every GPU found)")]
    TooFewSlots { asked: u32, host: String, have: u32 },
    /// `--include`/`--exclude` applied to the cluster file's nodes.
    #[error(transparent)]
    Filter(super::hostfile::FilterError),
}

/// Decides the hosts and how many workers each runs: discovery's nodes (or the cluster
/// file's, when there is no allocation), `--nnodes` checked against what was found, and
/// `--nproc-per-node` (default: every GPU discovery or the profile knows of, else 1).
/// `profile` is the cluster profile and the file it came from.
pub fn allocate(
    discovery: Discovery,
    profile: Option<(&Path, &ClusterProfile)>,
    request: AllocationRequest,
) -> Result<Allocation, AllocationError> {
    let Discovery {
        mut spec,
        mut warnings,
        deferred_filter,
    } = discovery;
    if let Some((path, profile)) = profile {
        if spec.source == NodeSource::Local {
            let nodes = profile
                .nodes
                .iter()
                .map(|n| Node {
                    host: n.host.clone(),
                    slots: n
                        .gpus()
                        .map_or(Slots::Unknown, |g| Slots::Count(g.len() as u32)),
                })
                .collect();
            // --include/--exclude filter the file's nodes, not this machine.
            spec.nodes = match &deferred_filter {
                Some(filter) => filter.apply(nodes).map_err(AllocationError::Filter)?,
                None => nodes,
            };
            spec.source = NodeSource::ClusterFile {
                path: path.display().to_string(),
            };
        } else if let Some(missing) = {
            let index = profile.node_indices();
            spec.nodes
                .iter()
                .find(|n| !index.contains_key(&super::host_key(&n.host)))
        } {
            return Err(AllocationError::NotInProfile {
                path: path.display().to_string(),
                problem: format!("has no node {:?}", missing.host),
            });
        }
    }
    if let (Some(filter), NodeSource::Local) = (&deferred_filter, &spec.source) {
        spec.nodes = filter
            .apply(std::mem::take(&mut spec.nodes))
            .map_err(AllocationError::Filter)?;
    }
    if let Some(range) = request.nnodes {
        if !range.contains(spec.nodes.len()) {
            return Err(AllocationError::NodeCount {
                asked: range,
                found: spec.hosts(),
            });
        }
    }
    let index = profile.map(|(_, p)| (p, p.node_indices()));
    let profiled = |host: &str| {
        index.as_ref().and_then(|(p, index)| {
            index
                .get(&super::host_key(host))
                .and_then(|i| p.nodes[*i].gpus())
        })
    };
    let mut hosts = Vec::with_capacity(spec.nodes.len());
    let pbs = matches!(spec.source, NodeSource::Pbs { .. });
    for node in spec.nodes {
        let gpus = profiled(&node.host);
        let gpu_count = gpus.map(|g| g.len() as u32);
        let known = match (pbs, node.slots.count()) {
            (true, Some(slots)) => pbs_slots(&node.host, slots, gpu_count, request, &mut warnings),
            _ => node.slots.count().or(gpu_count),
        };
        let workers = match request.nproc_per_node {
            Some(NprocPerNode::Count(n)) => {
                if let Some(have) = known.filter(|have| n > *have) {
                    return Err(AllocationError::TooFewSlots {
                        asked: n,
                        host: node.host,
                        have,
                    });
                }
                Some(n)
            }
            None => Some(known.unwrap_or(1)),
            Some(NprocPerNode::Gpu | NprocPerNode::Auto) => known,
            // torchrun counts CPUs or XPUs on the node itself.
            Some(NprocPerNode::Cpu | NprocPerNode::Xpu) => None,
        };
        hosts.push(HostAllocation {
            gpu: gpus.and_then(|g| g.first()).map(|g| g.name.clone()),
            devices: match node.slots {
                Slots::Devices(d) => Some(d),
                _ => None,
            },
            host: node.host,
            workers,
        });
    }
    Ok(Allocation {
        source: spec.source,
        job_id: spec.job_id,
        hosts,
        warnings,
    })
}

impl Allocation {
    /// The hosts, in order.
    pub fn host_names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.host.clone()).collect()
    }

    /// Total workers across the hosts, when every host's count is known.
    pub fn world_size(&self) -> Option<u64> {
        self.hosts.iter().map(|h| h.workers.map(u64::from)).sum()
    }

    /// `profile` (read from `path`) narrowed to these hosts, in this order, each with the
    /// GPUs it may use.
    pub fn narrow(
        &self,
        path: &Path,
        profile: &ClusterProfile,
    ) -> Result<ClusterProfile, AllocationError> {
        let selections: Vec<NodeSelection<'_>> = self
            .hosts
            .iter()
            .map(|h| NodeSelection {
                host: &h.host,
                devices: h.device_selection(),
            })
            .collect();
        profile
            .subset(&selections)
            .map_err(|problem| AllocationError::NotInProfile {
                path: path.display().to_string(),
                problem,
            })
    }
}

impl HostAllocation {
    /// Which of the node's GPUs the job may use: the devices discovery named, else the
    /// first `workers`, else all.
    pub fn device_selection(&self) -> DeviceSelection {
        match (&self.devices, self.workers) {
            (Some(d), _) => DeviceSelection::Indices(d.clone()),
            (None, Some(n)) => DeviceSelection::First(n as usize),
            (None, None) => DeviceSelection::All,
        }
    }
}

/// A PBS host's GPU count: its node-file lines are GPUs only when they agree with the
/// GPUs the profile found there or with `--nproc-per-node`. Otherwise they count CPU
/// cores (or one line per node), and the GPUs found decide, with a warning that says so.
fn pbs_slots(
    host: &str,
    slots: u32,
    gpus: Option<u32>,
    request: AllocationRequest,
    warnings: &mut Vec<String>,
) -> Option<u32> {
    let asked = match request.nproc_per_node {
        Some(NprocPerNode::Count(n)) => Some(n),
        _ => None,
    };
    if gpus == Some(slots) || asked == Some(slots) {
        return Some(slots);
    }
    match gpus {
        Some(found) => {
            warnings.push(format!(
                "PBS_NODEFILE lists {host} {slots} time{} but the profile finds {found} GPU{} there: \
                 using the {found} GPUs (PBS lines count CPU slots unless the job asks for one per GPU)",
                plural(slots),
                plural(found)
            ));
            Some(found)
        }
        // Nothing measured yet: the user's count decides, else the file's.
        None if asked.is_some() => None,
        None => Some(slots),
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `--nnodes N` or `--nnodes MIN:MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRange {
    pub min: u32,
    pub max: u32,
}

impl NodeRange {
    pub fn contains(&self, nodes: usize) -> bool {
        (self.min as usize..=self.max as usize).contains(&nodes)
    }
}

impl FromStr for NodeRange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |part: &str| {
            part.trim().parse::<u32>().map_err(|_| {
                format!("{part:?} is not a node count (write N or MIN:MAX, e.g. 4 or 2:4)")
            })
        };
        let (min, max) = match s.split_once(':') {
            None => {
                let n = parse(s)?;
                (n, n)
            }
            Some((a, b)) => (parse(a)?, parse(b)?),
        };
        if max as usize > super::MAX_NODES {
            return Err(format!(
                "{s:?} is more than {} nodes, more than any cluster has (give the job's node count)",
                super::MAX_NODES
            ));
        }
        if min == 0 || min > max {
            return Err(format!(
                "{s:?} is not a valid node range (need 0 < MIN <= MAX, e.g. 2:4)"
            ));
        }
        Ok(NodeRange { min, max })
    }
}

impl fmt::Display for NodeRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}:{}", self.min, self.max)
        }
    }
}

/// `--nproc-per-node`: a count, or a kind of device to count on each node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NprocPerNode {
    Count(u32),
    Gpu,
    Cpu,
    Xpu,
    Auto,
}

impl FromStr for NprocPerNode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gpu" => Ok(NprocPerNode::Gpu),
            "cpu" => Ok(NprocPerNode::Cpu),
            "xpu" => Ok(NprocPerNode::Xpu),
            "auto" => Ok(NprocPerNode::Auto),
            _ => match s.parse::<u64>() {
                Ok(n) if n > u64::from(super::MAX_SLOTS) => Err(format!(
                    "{n} workers per node is more than {}, more than any node has GPUs \
                     (give the node's GPU count, or gpu to use every GPU found)",
                    super::MAX_SLOTS
                )),
                Ok(n) if n > 0 => Ok(NprocPerNode::Count(n as u32)),
                _ if s.starts_with('-') => Err(format!(
                    "{s:?} is negative (use a worker count from 1 to {}, or gpu, cpu, xpu or auto)",
                    super::MAX_SLOTS
                )),
                _ => Err(format!(
                    "{s:?} is not a worker count (use a positive integer, gpu, cpu, xpu or auto)"
                )),
            },
        }
    }
}

impl fmt::Display for NprocPerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NprocPerNode::Count(n) => write!(f, "{n}"),
            NprocPerNode::Gpu => f.write_str("gpu"),
            NprocPerNode::Cpu => f.write_str("cpu"),
            NprocPerNode::Xpu => f.write_str("xpu"),
            NprocPerNode::Auto => f.write_str("auto"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterSpec;
    use serde_json::json;

    /// A valid profile of these hosts, each with `gpus` A100s (indices 0..gpus).
    fn profile(hosts: &[&str], gpus: u32) -> ClusterProfile {
        let gpu = |i: u32| {
            json!({"index": i, "name": "A100-SXM4-80GB", "memory_bytes": 85899345920u64,
                   "peak_tflops": {"bf16": 312.0, "fp16": 312.0}, "provenance": {"source": "datasheet"}})
        };
        let square = |n: usize, v: f64| {
            (0..n)
                .map(|a| (0..n).map(|b| if a == b { 0.0 } else { v }).collect())
                .collect::<Vec<Vec<f64>>>()
        };
        let nodes: Vec<_> = hosts
            .iter()
            .map(|h| {
                json!({"host": h, "gpus": (0..gpus).map(gpu).collect::<Vec<_>>(),
                       "gpu_links": {"provenance": {"source": "measured"},
                                     "gb_per_s": square(gpus as usize, 200.0)}})
            })
            .collect();
        let doc = json!({
            "schema": "pipette-cluster/1",
            "nodes": nodes,
            "node_links": {"provenance": {"source": "measured"}, "gb_per_s": square(hosts.len(), 20.0)}
        });
        ClusterProfile::from_json_str(&doc.to_string(), "c.json").expect("a valid profile")
    }

    fn found(source: NodeSource, nodes: &[(&str, Slots)]) -> Discovery {
        Discovery {
            spec: ClusterSpec {
                nodes: nodes
                    .iter()
                    .map(|(h, s)| Node {
                        host: h.to_string(),
                        slots: s.clone(),
                    })
                    .collect(),
                source,
                job_id: Some("42".into()),
            },
            warnings: vec!["a warning".into()],
            deferred_filter: None,
        }
    }

    fn nproc(n: NprocPerNode) -> AllocationRequest {
        AllocationRequest {
            nproc_per_node: Some(n),
            ..AllocationRequest::default()
        }
    }

    fn workers(a: &Allocation) -> Vec<Option<u32>> {
        a.hosts.iter().map(|h| h.workers).collect()
    }

    #[test]
    fn hosts_and_slots_come_from_discovery() {
        let d = found(
            NodeSource::Hosts,
            &[("a", Slots::Count(8)), ("b", Slots::Unknown)],
        );
        let a = allocate(d, None, AllocationRequest::default()).unwrap();
        assert_eq!(a.host_names(), ["a", "b"]);
        assert_eq!(workers(&a), [Some(8), Some(1)]);
        assert_eq!(a.world_size(), Some(9));
        assert_eq!(a.job_id.as_deref(), Some("42"));
        assert_eq!(a.warnings, ["a warning"]);
        assert_eq!(a.hosts[0].gpu, None);
        assert_eq!(a.hosts[0].device_selection(), DeviceSelection::First(8));

        let a = allocate(
            found(NodeSource::Hosts, &[("a", Slots::Unknown)]),
            None,
            nproc(NprocPerNode::Gpu),
        )
        .unwrap();
        assert_eq!(workers(&a), [None]);
        assert_eq!(a.world_size(), None);
        assert_eq!(a.hosts[0].device_selection(), DeviceSelection::All);
    }

    #[test]
    fn included_devices_are_the_slots() {
        // `--include a:1,3` (or SLURM_JOB_GPUS) leaves discovery with device indices.
        let d = found(NodeSource::Hosts, &[("a", Slots::Devices(vec![1, 3]))]);
        let p = profile(&["a"], 4);
        let a = allocate(
            d,
            Some((Path::new("c.json"), &p)),
            AllocationRequest::default(),
        )
        .unwrap();
        assert_eq!(workers(&a), [Some(2)]);
        assert_eq!(a.hosts[0].devices, Some(vec![1, 3]));
        assert_eq!(a.hosts[0].gpu.as_deref(), Some("A100-SXM4-80GB"));
        let narrowed = a.narrow(Path::new("c.json"), &p).unwrap();
        let indices: Vec<u32> = narrowed.nodes[0]
            .gpus()
            .unwrap()
            .iter()
            .map(|g| g.index)
            .collect();
        assert_eq!(indices, [1, 3]);
    }

    #[test]
    fn excluded_hosts_are_left_out_of_the_narrowed_profile() {
        // `--exclude b` leaves discovery with a and c; the profile has all three.
        let d = found(
            NodeSource::Hosts,
            &[("c", Slots::Unknown), ("a", Slots::Unknown)],
        );
        let p = profile(&["a", "b", "c"], 2);
        let a = allocate(
            d,
            Some((Path::new("c.json"), &p)),
            AllocationRequest::default(),
        )
        .unwrap();
        assert_eq!(workers(&a), [Some(2), Some(2)]);
        let narrowed = a.narrow(Path::new("c.json"), &p).unwrap();
        let hosts: Vec<&str> = narrowed.hosts().collect();
        assert_eq!(hosts, ["c", "a"]);
    }

    #[test]
    fn nproc_below_the_gpus_takes_the_first_ones() {
        let d = found(NodeSource::Hosts, &[("a", Slots::Unknown)]);
        let p = profile(&["a"], 4);
        let a = allocate(
            d,
            Some((Path::new("c.json"), &p)),
            nproc(NprocPerNode::Count(2)),
        )
        .unwrap();
        assert_eq!(workers(&a), [Some(2)]);
        assert_eq!(a.hosts[0].device_selection(), DeviceSelection::First(2));
        let narrowed = a.narrow(Path::new("c.json"), &p).unwrap();
        assert_eq!(narrowed.gpu_count(), Some(2));
    }

    #[test]
    fn nproc_above_the_slots_is_refused() {
        let d = found(NodeSource::Hosts, &[("a", Slots::Count(4))]);
        let err = allocate(d, None, nproc(NprocPerNode::Count(8))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--nproc-per-node 8 but node a has only 4 GPU slots (lower --nproc-per-node, or leave it out to use every GPU found)"
        );
    }

    #[test]
    fn without_an_allocation_the_cluster_file_names_the_nodes() {
        let d = found(NodeSource::Local, &[("here", Slots::Unknown)]);
        let p = profile(&["n0", "n1"], 4);
        let a = allocate(
            d,
            Some((Path::new("c.json"), &p)),
            AllocationRequest::default(),
        )
        .unwrap();
        assert_eq!(
            a.source,
            NodeSource::ClusterFile {
                path: "c.json".into()
            }
        );
        assert_eq!(a.host_names(), ["n0", "n1"]);
        assert_eq!(a.world_size(), Some(8));
        assert_eq!(a.narrow(Path::new("c.json"), &p).unwrap(), p);
    }

    #[test]
    fn a_host_the_profile_lacks_is_a_mismatch() {
        let d = found(
            NodeSource::Hosts,
            &[("n0", Slots::Unknown), ("x", Slots::Unknown)],
        );
        let p = profile(&["n0"], 2);
        let err = allocate(
            d,
            Some((Path::new("c.json"), &p)),
            AllocationRequest::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "c.json: has no node \"x\", which the allocation includes (profile the allocated nodes again, or pass a cluster file that covers them)"
        );
        // A device the profile's node does not have.
        let d = found(NodeSource::Hosts, &[("n0", Slots::Devices(vec![5]))]);
        let a = allocate(
            d,
            Some((Path::new("c.json"), &p)),
            AllocationRequest::default(),
        )
        .unwrap();
        let err = a.narrow(Path::new("c.json"), &p).unwrap_err();
        assert!(matches!(err, AllocationError::NotInProfile { .. }), "{err}");
        assert!(err.to_string().contains("has no GPU 5"), "{err}");
    }

    #[test]
    fn nnodes_must_match_the_nodes_found() {
        let d = || {
            found(
                NodeSource::Hosts,
                &[("a", Slots::Unknown), ("b", Slots::Unknown)],
            )
        };
        let request = |range: &str| AllocationRequest {
            nnodes: Some(range.parse().unwrap()),
            ..AllocationRequest::default()
        };
        assert!(allocate(d(), None, request("1:4")).is_ok());
        let err = allocate(d(), None, request("3")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--nnodes 3 but 2 nodes were found (a,b) (pipette-run uses the nodes it discovers: drop --nnodes, or fix the node list)"
        );
    }

    /// `--include`/`--exclude` filtered this machine instead of the cluster file's
    /// nodes; `--include a100-n00:99` then blamed the cluster file (exit 67).
    #[test]
    fn defect_06_filters_apply_to_the_cluster_file_s_nodes() {
        let p = profile(&["n0", "n1", "n2"], 4);
        let with = |include: Option<&str>, exclude: Option<&str>| {
            let mut d = found(NodeSource::Local, &[("here", Slots::Unknown)]);
            d.deferred_filter = Some(crate::cluster::discover::FilterRequest {
                include: include.map(String::from),
                exclude: exclude.map(String::from),
            });
            allocate(
                d,
                Some((Path::new("c.json"), &p)),
                AllocationRequest::default(),
            )
        };
        let a = with(Some("n2@n0:1,3"), None).unwrap();
        assert_eq!(a.host_names(), ["n0", "n2"]);
        assert_eq!(a.hosts[0].devices, Some(vec![1, 3]));
        assert_eq!(a.world_size(), Some(6));
        assert_eq!(with(None, Some("n1")).unwrap().host_names(), ["n0", "n2"]);
        let e = with(Some("n0:99"), None).unwrap_err();
        assert!(matches!(e, AllocationError::Filter(_)), "{e:?}");
        assert!(e.to_string().contains("has no slot 99"), "{e}");
        // Without a cluster file the filter is this machine's.
        let mut d = found(NodeSource::Local, &[("here", Slots::Unknown)]);
        d.deferred_filter = Some(crate::cluster::discover::FilterRequest {
            include: Some("n0".into()),
            exclude: None,
        });
        assert!(allocate(d, None, AllocationRequest::default()).is_err());
    }

    /// `--nproc-per-node 99999` asked torchrun for 99,999 local processes; `--nnodes`
    /// took any count.
    #[test]
    fn defect_14_worker_and_node_counts_are_capped() {
        assert_eq!("1024".parse(), Ok(NprocPerNode::Count(1024)));
        let e = "99999".parse::<NprocPerNode>().unwrap_err();
        assert!(e.contains("more than 1024"), "{e}");
        let e = "-1".parse::<NprocPerNode>().unwrap_err();
        assert!(e.contains("negative"), "{e}");
        assert!("1000000".parse::<NodeRange>().is_ok());
        let e = "1000001".parse::<NodeRange>().unwrap_err();
        assert!(e.contains("more than 1000000 nodes"), "{e}");
    }

    /// PBS node-file lines are GPUs only when they agree with what the profile or
    /// --nproc-per-node says; else the GPUs found are used, with a warning.
    #[test]
    fn pbs_slots_are_gpus_only_when_they_agree() {
        let pbs = || NodeSource::Pbs {
            path: "nodes".into(),
        };
        let p = profile(&["a", "b"], 8);
        let c = Path::new("c.json");
        // One line per node: the 8 GPUs found, and a warning for each host.
        let d = found(pbs(), &[("a", Slots::Count(1)), ("b", Slots::Count(1))]);
        let a = allocate(d, Some((c, &p)), AllocationRequest::default()).unwrap();
        assert_eq!(workers(&a), [Some(8), Some(8)]);
        let warned: Vec<_> = a
            .warnings
            .iter()
            .filter(|w| w.contains("PBS_NODEFILE"))
            .collect();
        assert_eq!(warned.len(), 2, "{:?}", a.warnings);
        assert!(warned[0].contains("using the 8 GPUs"), "{}", warned[0]);
        // Agreeing with the profile: as listed, no warning.
        let d = found(pbs(), &[("a", Slots::Count(8)), ("b", Slots::Count(8))]);
        let a = allocate(d, Some((c, &p)), AllocationRequest::default()).unwrap();
        assert_eq!(workers(&a), [Some(8), Some(8)]);
        assert!(!a.warnings.iter().any(|w| w.contains("PBS_NODEFILE")));
        // --nproc-per-node beyond the lines but within the GPUs is not refused.
        let d = found(pbs(), &[("a", Slots::Count(1)), ("b", Slots::Count(1))]);
        let a = allocate(d, Some((c, &p)), nproc(NprocPerNode::Count(4))).unwrap();
        assert_eq!(workers(&a), [Some(4), Some(4)]);
        // Without a profile, --nproc-per-node decides over the lines.
        let d = found(pbs(), &[("a", Slots::Count(2))]);
        let a = allocate(d, None, nproc(NprocPerNode::Count(8))).unwrap();
        assert_eq!(workers(&a), [Some(8)]);
        // A hostfile's slots stay binding.
        let d = found(NodeSource::Hosts, &[("a", Slots::Count(2))]);
        assert!(allocate(d, None, nproc(NprocPerNode::Count(8))).is_err());
    }
}
