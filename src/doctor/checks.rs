//! `pipette doctor`'s judgement: the facts gathered from every node ([`NodeFacts`]) in, the
//! findings out, each with the hosts it concerns and what to do. Pure, so every rule is
//! tested over a table of cases.

use serde::Serialize;

use super::facts::{Disk, Gpus, NodeFacts, Reach, Torchrun};
use crate::cluster::hostlist::compress as compress_hosts;
use crate::exec::TransportKind;
use crate::exit::ExitCode;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; a run would still go.
    Warning,
    /// A run would fail (or could not start) on these nodes.
    Problem,
}

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    Reach,
    Torchrun,
    Python,
    Torch,
    MegatronCore,
    Gpus,
    Nccl,
    Clock,
    Disk,
}

/// One thing wrong, on some nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub check: Check,
    /// The nodes it concerns, in the order they were found.
    pub hosts: Vec<String>,
    /// What is wrong (without the hosts).
    pub what: String,
    /// What to do about it.
    pub fix: String,
}

/// What the checks are held to, besides the facts.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How the nodes are reached (the advice for an unreachable node depends on it).
    pub transport: TransportKind,
    /// A clock further off than this (beyond the measurement's uncertainty) is a warning.
    pub clock_tolerance_seconds: f64,
    /// Less free space than this where the run directory goes is a problem.
    pub disk_problem_bytes: u64,
    /// Less than this is a warning.
    pub disk_warning_bytes: u64,
}

impl Limits {
    /// A warning below `min_free` bytes free, a problem below 1 GiB (or `min_free`, if
    /// less); clocks within 2 s.
    pub fn with_min_free(transport: TransportKind, min_free: u64) -> Limits {
        Limits {
            transport,
            clock_tolerance_seconds: 2.0,
            disk_problem_bytes: min_free.min(1 << 30),
            disk_warning_bytes: min_free,
        }
    }
}

/// The findings about `nodes`: problems first, then warnings; within each, in the order of
/// [`Check`]. Findings that say the same of several nodes are one finding.
pub fn diagnose(nodes: &[NodeFacts], limits: &Limits) -> Vec<Finding> {
    let mut findings: Vec<Finding> = Vec::new();
    let mut add = |severity, check, host: &str, what: String, fix: String| match findings
        .iter_mut()
        .find(|f| f.severity == severity && f.check == check && f.what == what && f.fix == fix)
    {
        Some(same) => same.hosts.push(host.to_string()),
        None => findings.push(Finding {
            severity,
            check,
            hosts: vec![host.to_string()],
            what,
            fix,
        }),
    };
    for node in nodes {
        for (severity, check, what, fix) in node_findings(node, limits) {
            add(severity, check, &node.host, what, fix);
        }
    }
    findings.extend(across_nodes(nodes));
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.check.cmp(&b.check)));
    findings
}

type NodeFinding = (Severity, Check, String, String);

/// What is wrong with one node on its own.
fn node_findings(node: &NodeFacts, limits: &Limits) -> Vec<NodeFinding> {
    use Severity::{Problem, Warning};
    let mut out: Vec<NodeFinding> = Vec::new();
    match &node.reach {
        Reach::Reached => {}
        Reach::Unreachable { why } => {
            out.push((
                Problem,
                Check::Reach,
                format!("not reached: {why}"),
                reach_fix(limits.transport),
            ));
            return out;
        }
        Reach::TimedOut { seconds } => {
            out.push((
                Problem,
                Check::Reach,
                format!("did not answer within {} (hung, or very slow)", seconds_text(*seconds)),
                "check the node (its load, a hung file system such as NFS), or allow more time with --timeout".into(),
            ));
            return out;
        }
    }
    let torchrun_found = match &node.torchrun {
        Torchrun::Found { .. } => true,
        Torchrun::Missing { name, venv } => {
            let where_ = match name.contains('/') {
                true => format!("{name:?} is not an executable file there"),
                false => format!(
                    "{name:?} is not on its PATH ({})",
                    node.path.as_deref().unwrap_or("unset")
                ),
            };
            out.push((
                Problem,
                Check::Torchrun,
                format!("torchrun not found: {where_}"),
                match venv {
                    // pipette-run looks on the PATH only: the venv found has to be named.
                    Some(venv) => format!(
                        "activate the environment that has PyTorch before running pipette (PATH is forwarded to the nodes): the venv of {venv} is there (`. {}/activate`), or give --torchrun {venv}",
                        venv.rsplit_once('/').map_or(".", |(bin, _)| bin)
                    ),
                    None => "activate the environment that has PyTorch before running pipette (PATH is forwarded to the nodes), or give --env PATH=... or --torchrun PATH-ON-THE-NODES".into(),
                },
            ));
            false
        }
        Torchrun::Unknown => false,
    };
    let python = &node.python;
    // Without torchrun, what its python imports is moot: one problem, not three.
    if torchrun_found {
        match (&python.executable, &python.error, &python.torch_error) {
            (None, _, _) => out.push((
                Problem,
                Check::Python,
                "no python for torchrun (none in its #! line, none beside it, no python3 on PATH)"
                    .into(),
                "install Python with PyTorch there, or repair torchrun's #! line".into(),
            )),
            (Some(exe), Some(error), _) => out.push((
                Problem,
                Check::Python,
                format!("torchrun's python {exe} cannot run: {error}"),
                "repair that Python installation (pipette doctor runs it as torchrun would)".into(),
            )),
            (Some(exe), None, Some(error)) => out.push((
                Problem,
                Check::Torch,
                format!("PyTorch does not import in torchrun's python {exe}: {error}"),
                "install PyTorch in the environment torchrun belongs to".into(),
            )),
            _ => {}
        }
    }
    match &node.gpus {
        Gpus::Failed { why } => out.push((
            Problem,
            Check::Gpus,
            format!("nvidia-smi failed: {why}"),
            "check the NVIDIA driver there (run nvidia-smi), or leave the node out with --exclude"
                .into(),
        )),
        Gpus::Listed { gpus } if !gpus.is_empty() && python.torch.is_some() => {
            let torch = python.torch.as_deref().unwrap_or_default();
            if python.cuda.is_none() {
                out.push((
                    Problem,
                    Check::Torch,
                    format!(
                        "PyTorch {torch} is a CPU build, but the node has {} GPUs",
                        gpus.len()
                    ),
                    "install a CUDA build of PyTorch there".into(),
                ));
            } else if python.cuda_devices == Some(0) {
                out.push((
                    Problem,
                    Check::Torch,
                    format!(
                        "PyTorch {torch} sees no GPU, but nvidia-smi lists {}",
                        gpus.len()
                    ),
                    format!(
                        "check CUDA_VISIBLE_DEVICES there, and that the driver supports CUDA {}",
                        python.cuda.as_deref().unwrap_or_default()
                    ),
                ));
            }
        }
        _ => {}
    }
    if let Some(clock) = node.clock {
        if clock.seconds.abs() - clock.uncertainty_seconds > limits.clock_tolerance_seconds {
            let direction = if clock.seconds > 0.0 {
                "ahead of"
            } else {
                "behind"
            };
            out.push((
                Warning,
                Check::Clock,
                format!(
                    "its clock is {} {direction} this machine's (±{})",
                    seconds_text(clock.seconds.abs()),
                    seconds_text(clock.uncertainty_seconds)
                ),
                "synchronise the clocks (chrony or NTP): the nodes' logs will not line up, and Slurm's munge refuses credentials 5 minutes off".into(),
            ));
        }
    }
    match &node.disk {
        Disk::Known {
            dir,
            free_bytes,
            writable,
        } => {
            let move_it = "free some space, or choose --run-dir elsewhere";
            if *free_bytes < limits.disk_problem_bytes {
                out.push((
                    Problem,
                    Check::Disk,
                    format!(
                        "only {} free at {dir}, where the run directory goes",
                        bytes_text(*free_bytes)
                    ),
                    move_it.into(),
                ));
            } else if *free_bytes < limits.disk_warning_bytes {
                out.push((
                    Warning,
                    Check::Disk,
                    format!(
                        "only {} free at {dir}, where the run directory goes",
                        bytes_text(*free_bytes)
                    ),
                    move_it.into(),
                ));
            }
            if !writable {
                out.push((
                    Warning,
                    Check::Disk,
                    format!("{dir}, where the run directory goes, is not writable there"),
                    "choose a --run-dir the nodes can write (logs and checkpoints usually go beside it)".into(),
                ));
            }
        }
        Disk::Failed { why } => out.push((
            Warning,
            Check::Disk,
            format!("free space where the run directory goes is unknown: {why}"),
            "check the file system there".into(),
        )),
        Disk::Unknown => {}
    }
    out
}

fn reach_fix(transport: TransportKind) -> String {
    match transport {
        TransportKind::Ssh => "check that `ssh HOST true` works from here without a password (pipette runs ssh in batch mode); --ssh-config and --ssh-args reach ssh".into(),
        TransportKind::Srun => "check that the node is in this Slurm allocation and up (squeue, sinfo); --srun-args reach srun".into(),
        TransportKind::Local => "check that sh runs on this machine".into(),
        TransportKind::Agent => "check that the node's copy of pipette-run runs".into(),
    }
}

/// What differs between the reached nodes: software versions, GPUs, NCCL settings.
fn across_nodes(nodes: &[NodeFacts]) -> Vec<Finding> {
    use Severity::{Problem, Warning};
    let reached: Vec<&NodeFacts> = nodes.iter().filter(|n| n.reached()).collect();
    let mut out = Vec::new();
    let with_gpus: Vec<String> = reached
        .iter()
        .filter(|n| matches!(&n.gpus, Gpus::Listed { gpus } if !gpus.is_empty()))
        .map(|n| n.host.clone())
        .collect();
    let without: Vec<String> = reached
        .iter()
        .filter(|n| match &n.gpus {
            Gpus::NoNvidiaSmi => true,
            Gpus::Listed { gpus } => gpus.is_empty(),
            _ => false,
        })
        .map(|n| n.host.clone())
        .collect();
    if !with_gpus.is_empty() && !without.is_empty() {
        out.push(Finding {
            severity: Problem,
            check: Check::Gpus,
            hosts: without.clone(),
            what: format!(
                "these nodes have no GPU, but {} have",
                compress_hosts(&with_gpus)
            ),
            fix: "pipette-run runs clusters of one kind: leave the CPU nodes out with --exclude"
                .into(),
        });
    }
    let fix_versions = "install the same versions everywhere: ranks of different versions can hang in collectives or fail to load each other's checkpoints";
    let differing: [(Check, &str, NodeValue); 4] = [
        (Check::Python, "Python", |n| n.python.version.clone()),
        (Check::Torch, "PyTorch", |n| n.python.torch.clone()),
        (Check::MegatronCore, "megatron-core", |n| {
            n.python.version.as_ref().map(|_| {
                n.python
                    .megatron_core
                    .clone()
                    .unwrap_or_else(|| "none".into())
            })
        }),
        (Check::Gpus, "the GPUs", |n| match &n.gpus {
            Gpus::Listed { gpus } if !gpus.is_empty() => Some(gpus_text(gpus)),
            _ => None,
        }),
    ];
    // Versions matter where torchrun was found: elsewhere the python probed is only the
    // first on PATH, and the missing torchrun is the finding.
    let with_torchrun: Vec<&NodeFacts> = reached
        .iter()
        .copied()
        .filter(|n| matches!(n.torchrun, Torchrun::Found { .. }))
        .collect();
    for (check, name, value) in differing {
        let nodes = match check {
            Check::Gpus => &reached,
            _ => &with_torchrun,
        };
        let groups = group_by(nodes, value);
        if groups.len() > 1 {
            let fix = match check {
                Check::Gpus => "pipette-run plans for the GPUs each node has; check that this is the allocation you meant",
                _ => fix_versions,
            };
            out.push(Finding {
                severity: Warning,
                check,
                hosts: in_node_order(&reached, &groups),
                what: format!(
                    "{name} differ{} across the nodes: {}",
                    if name.starts_with("the ") { "" } else { "s" },
                    groups_text(&groups)
                ),
                fix: fix.into(),
            });
        }
    }
    let nccl = group_by(&reached, nccl_text);
    if nccl.len() > 1 {
        let groups: Vec<(String, Vec<String>)> = nccl
            .into_iter()
            .map(|(v, h)| (if v.is_empty() { "none".to_string() } else { v }, h))
            .collect();
        out.push(Finding {
            severity: Warning,
            check: Check::Nccl,
            hosts: in_node_order(&reached, &groups),
            what: format!(
                "the NCCL_* settings differ across the nodes: {}",
                groups_text(&groups)
            ),
            fix: "set them alike on every node (--env NAME=VALUE, or an env file)".into(),
        });
    }
    out
}

/// A value of a node that should be the same on every node.
type NodeValue = fn(&NodeFacts) -> Option<String>;

/// A node's `NCCL_*` variables as `NAME=VALUE` words (empty when none is set).
pub fn nccl_text(node: &NodeFacts) -> Option<String> {
    let set: Vec<String> = node.nccl.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Some(set.join(" "))
}

/// The nodes with a value, grouped by it in the order of first appearance.
pub fn group_by(
    nodes: &[&NodeFacts],
    value: impl Fn(&NodeFacts) -> Option<String>,
) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for node in nodes {
        let Some(v) = value(node) else { continue };
        match groups.iter_mut().find(|(g, _)| *g == v) {
            Some((_, hosts)) => hosts.push(node.host.clone()),
            None => groups.push((v, vec![node.host.clone()])),
        }
    }
    groups
}

/// The hosts of `groups`, in the order of `nodes`.
fn in_node_order(nodes: &[&NodeFacts], groups: &[(String, Vec<String>)]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| groups.iter().any(|(_, hosts)| hosts.contains(&n.host)))
        .map(|n| n.host.clone())
        .collect()
}

/// `2.9.0 on n[1-3], 2.8.0 on n4`.
fn groups_text(groups: &[(String, Vec<String>)]) -> String {
    groups
        .iter()
        .map(|(v, hosts)| format!("{v} on {}", compress_hosts(hosts)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `8× NVIDIA H100 80GB HBM3 (80 GiB)`; mixed models listed one by one.
pub fn gpus_text(gpus: &[super::facts::Gpu]) -> String {
    let mut kinds: Vec<(&str, u64, usize)> = Vec::new();
    for g in gpus {
        match kinds
            .iter_mut()
            .find(|(n, m, _)| *n == g.name && *m == g.memory_bytes)
        {
            Some((_, _, count)) => *count += 1,
            None => kinds.push((&g.name, g.memory_bytes, 1)),
        }
    }
    kinds
        .iter()
        .map(|(name, memory, count)| format!("{count}× {name} ({})", bytes_text(*memory)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `1.5 s`, `12 s`, `3 min`.
fn seconds_text(seconds: f64) -> String {
    crate::exec::format_duration(std::time::Duration::from_secs_f64(seconds.clamp(0.0, 1e9)))
}

/// Bytes in binary units, two or three significant digits: `512 MiB`, `20 GiB`, `1.2 TiB`.
pub fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match value < 10.0 && unit > 0 {
        true => format!("{value:.1} {}", UNITS[unit]),
        false => format!("{value:.0} {}", UNITS[unit]),
    }
}

/// The exit code for `findings`: a node not reached first (68), then torchrun missing
/// (71), then any other problem (73); warnings alone are success.
pub fn exit_code(findings: &[Finding]) -> ExitCode {
    let problem = |check: Option<Check>| {
        findings
            .iter()
            .any(|f| f.severity == Severity::Problem && check.is_none_or(|c| f.check == c))
    };
    if problem(Some(Check::Reach)) {
        ExitCode::Unreachable
    } else if problem(Some(Check::Torchrun)) {
        ExitCode::NoTorchrun
    } else if problem(None) {
        ExitCode::NodeNotReady
    } else {
        ExitCode::Success
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::facts::{ClockSkew, Gpu, PythonFacts};
    use super::*;

    /// A healthy CPU node.
    pub(crate) fn good(host: &str) -> NodeFacts {
        NodeFacts {
            host: host.into(),
            reach: Reach::Reached,
            path: Some("/venv/bin:/usr/bin".into()),
            torchrun: Torchrun::Found {
                path: "/venv/bin/torchrun".into(),
            },
            python: PythonFacts {
                executable: Some("/venv/bin/python".into()),
                version: Some("3.12.1".into()),
                torch: Some("2.9.0".into()),
                cuda: Some("12.8".into()),
                cuda_devices: Some(0),
                megatron_core: Some("0.19.2".into()),
                ..PythonFacts::default()
            },
            gpus: Gpus::NoNvidiaSmi,
            nccl: Default::default(),
            clock: Some(ClockSkew {
                seconds: 0.01,
                uncertainty_seconds: 0.05,
            }),
            disk: Disk::Known {
                dir: "/work".into(),
                free_bytes: 100 << 30,
                writable: true,
            },
        }
    }

    fn h100s(n: usize) -> Gpus {
        Gpus::Listed {
            gpus: vec![
                Gpu {
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_bytes: 81559 << 20
                };
                n
            ],
        }
    }

    /// A healthy node with 8 H100s.
    pub(crate) fn gpu_node(host: &str) -> NodeFacts {
        let mut n = good(host);
        n.gpus = h100s(8);
        n.python.cuda_devices = Some(8);
        n
    }

    /// (case, nodes, expected findings as `severity check hosts: what`, exit code).
    #[allow(clippy::type_complexity)]
    fn cases() -> Vec<(&'static str, Vec<NodeFacts>, Vec<&'static str>, ExitCode)> {
        let mut v = Vec::new();
        v.push((
            "healthy CPU nodes",
            vec![good("n1"), good("n2")],
            vec![],
            ExitCode::Success,
        ));
        v.push((
            "healthy GPU nodes",
            vec![gpu_node("g1"), gpu_node("g2")],
            vec![],
            ExitCode::Success,
        ));
        v.push((
            "one node unreachable, one timed out",
            vec![
                good("n1"),
                NodeFacts::unreached(
                    "n2",
                    Reach::Unreachable {
                        why: "ssh to n2 failed: Connection refused".into(),
                    },
                ),
                NodeFacts::unreached("n3", Reach::TimedOut { seconds: 30.0 }),
            ],
            vec![
                "problem reach n2: not reached: ssh to n2 failed: Connection refused",
                "problem reach n3: did not answer within 30 s (hung, or very slow)",
            ],
            ExitCode::Unreachable,
        ));
        let mut missing = good("n2");
        missing.torchrun = Torchrun::Missing {
            name: "torchrun".into(),
            venv: None,
        };
        missing.path = Some("/usr/bin:/bin".into());
        missing.python = PythonFacts {
            executable: Some("/usr/bin/python3".into()),
            version: Some("3.11.2".into()),
            torch_error: Some("ModuleNotFoundError: No module named 'torch'".into()),
            ..PythonFacts::default()
        };
        let mut missing3 = missing.clone();
        missing3.host = "n3".into();
        v.push((
            "torchrun missing on two nodes: one finding, no cascade of python problems",
            vec![good("n1"), missing, missing3],
            vec!["problem torchrun n2,n3: torchrun not found: \"torchrun\" is not on its PATH (/usr/bin:/bin)"],
            ExitCode::NoTorchrun,
        ));
        let mut by_path = good("n1");
        by_path.torchrun = Torchrun::Missing {
            name: "/opt/venv/bin/torchrun".into(),
            venv: None,
        };
        v.push((
            "--torchrun names no executable",
            vec![by_path],
            vec!["problem torchrun n1: torchrun not found: \"/opt/venv/bin/torchrun\" is not an executable file there"],
            ExitCode::NoTorchrun,
        ));
        let mut no_torch = good("n1");
        no_torch.python.torch = None;
        no_torch.python.torch_error = Some("ModuleNotFoundError: No module named 'torch'".into());
        let mut broken_python = good("n2");
        broken_python.python = PythonFacts {
            executable: Some("/venv/bin/python".into()),
            error: Some("SyntaxError: invalid syntax".into()),
            ..PythonFacts::default()
        };
        let mut no_python = good("n3");
        no_python.python = PythonFacts::default();
        v.push((
            "torch missing, python broken, python missing",
            vec![no_torch, broken_python, no_python],
            vec![
                "problem python n2: torchrun's python /venv/bin/python cannot run: SyntaxError: invalid syntax",
                "problem python n3: no python for torchrun (none in its #! line, none beside it, no python3 on PATH)",
                "problem torch n1: PyTorch does not import in torchrun's python /venv/bin/python: ModuleNotFoundError: No module named 'torch'",
            ],
            ExitCode::NodeNotReady,
        ));
        let mut cpu_build = gpu_node("g1");
        cpu_build.python.cuda = None;
        let mut blind = gpu_node("g2");
        blind.python.cuda_devices = Some(0);
        let mut failed = gpu_node("g3");
        failed.gpus = Gpus::Failed {
            why: "exit status 9: NVIDIA-SMI has failed".into(),
        };
        v.push((
            "GPU nodes whose PyTorch cannot use them, and a failed driver",
            vec![cpu_build, blind, failed],
            vec![
                "problem torch g1: PyTorch 2.9.0 is a CPU build, but the node has 8 GPUs",
                "problem torch g2: PyTorch 2.9.0 sees no GPU, but nvidia-smi lists 8",
                "problem gpus g3: nvidia-smi failed: exit status 9: NVIDIA-SMI has failed",
            ],
            ExitCode::NodeNotReady,
        ));
        let mut four = gpu_node("g2");
        four.gpus = h100s(4);
        v.push((
            "GPU and CPU nodes mixed, GPU counts differ",
            vec![gpu_node("g1"), four, good("c1")],
            vec![
                "problem gpus c1: these nodes have no GPU, but g[1-2] have",
                "warning gpus g1,g2: the GPUs differ across the nodes: 8× NVIDIA H100 80GB HBM3 (80 GiB) on g1, 4× NVIDIA H100 80GB HBM3 (80 GiB) on g2",
            ],
            ExitCode::NodeNotReady,
        ));
        let mut old_torch = good("n2");
        old_torch.python.torch = Some("2.8.0".into());
        old_torch.python.megatron_core = None;
        old_torch.nccl.insert("NCCL_IB_HCA".into(), "mlx5_0".into());
        v.push((
            "versions and NCCL settings differ",
            vec![good("n1"), old_torch, good("n3")],
            vec![
                "warning torch n1,n2,n3: PyTorch differs across the nodes: 2.9.0 on n[1,3], 2.8.0 on n2",
                "warning megatron_core n1,n2,n3: megatron-core differs across the nodes: 0.19.2 on n[1,3], none on n2",
                "warning nccl n1,n2,n3: the NCCL_* settings differ across the nodes: none on n[1,3], NCCL_IB_HCA=mlx5_0 on n2",
            ],
            ExitCode::Success,
        ));
        let mut ahead = good("n1");
        ahead.clock = Some(ClockSkew {
            seconds: 30.0,
            uncertainty_seconds: 0.5,
        });
        let mut noisy = good("n2");
        // Off by 2.4 s, but the round trip took 1 s: within the tolerance.
        noisy.clock = Some(ClockSkew {
            seconds: -2.4,
            uncertainty_seconds: 0.5,
        });
        let mut behind = good("n3");
        behind.clock = Some(ClockSkew {
            seconds: -125.0,
            uncertainty_seconds: 0.1,
        });
        v.push((
            "clocks off",
            vec![ahead, noisy, behind],
            vec![
                "warning clock n1: its clock is 30 s ahead of this machine's (±500 ms)",
                "warning clock n3: its clock is 2 min 5 s behind this machine's (±100 ms)",
            ],
            ExitCode::Success,
        ));
        let mut full = good("n1");
        full.disk = Disk::Known {
            dir: "/scratch".into(),
            free_bytes: 300 << 20,
            writable: true,
        };
        let mut low = good("n2");
        low.disk = Disk::Known {
            dir: "/scratch".into(),
            free_bytes: 5 << 30,
            writable: false,
        };
        let mut unknown = good("n3");
        unknown.disk = Disk::Failed {
            why: "`df -Pk /x` said \"df: /x: Permission denied\"".into(),
        };
        v.push((
            "disks nearly full, read-only, unknown",
            vec![full, low, unknown],
            vec![
                "problem disk n1: only 300 MiB free at /scratch, where the run directory goes",
                "warning disk n2: only 5.0 GiB free at /scratch, where the run directory goes",
                "warning disk n2: /scratch, where the run directory goes, is not writable there",
                "warning disk n3: free space where the run directory goes is unknown: `df -Pk /x` said \"df: /x: Permission denied\"",
            ],
            ExitCode::NodeNotReady,
        ));
        v
    }

    #[test]
    fn findings_over_a_table_of_cases() {
        for (case, nodes, expected, code) in cases() {
            let findings = diagnose(&nodes, &Limits::with_min_free(TransportKind::Ssh, 10 << 30));
            let seen: Vec<String> = findings
                .iter()
                .map(|f| {
                    let severity = serde_json::to_value(f.severity).unwrap();
                    let check = serde_json::to_value(f.check).unwrap();
                    format!(
                        "{} {} {}: {}",
                        severity.as_str().unwrap(),
                        check.as_str().unwrap(),
                        f.hosts.join(","),
                        f.what
                    )
                })
                .collect();
            assert_eq!(seen, expected, "{case}");
            assert_eq!(exit_code(&findings), code, "{case}");
            assert!(findings.iter().all(|f| !f.fix.is_empty()), "{case}");
        }
    }

    #[test]
    fn the_advice_for_an_unreachable_node_follows_the_transport() {
        let node = NodeFacts::unreached("n1", Reach::Unreachable { why: "x".into() });
        let fix = |t| {
            diagnose(
                std::slice::from_ref(&node),
                &Limits::with_min_free(t, 10 << 30),
            )[0]
            .fix
            .clone()
        };
        assert!(fix(TransportKind::Ssh).contains("ssh HOST true"));
        assert!(fix(TransportKind::Srun).contains("squeue"));
        assert!(fix(TransportKind::Local).contains("sh runs"));
    }

    /// torchrun not on the PATH but in a venv pipette-run knows of: still a problem (a
    /// launch looks on the PATH), its fix naming the venv.
    #[test]
    fn a_venv_off_the_path_is_named_in_the_fix() {
        let mut node = good("n1");
        node.torchrun = Torchrun::Missing {
            name: "torchrun".into(),
            venv: Some("/home/u/.cache/pipette-run/megatron-venv/bin/torchrun".into()),
        };
        let findings = diagnose(
            std::slice::from_ref(&node),
            &Limits::with_min_free(TransportKind::Local, 0),
        );
        assert_eq!(exit_code(&findings), ExitCode::NoTorchrun);
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(
            findings[0].fix.contains(
                "(`. /home/u/.cache/pipette-run/megatron-venv/bin/activate`), or give --torchrun /home/u/.cache/pipette-run/megatron-venv/bin/torchrun"
            ),
            "{}",
            findings[0].fix
        );
    }

    #[test]
    fn min_free_sets_the_warning_and_caps_the_problem() {
        let mut node = good("n1");
        node.disk = Disk::Known {
            dir: "/scratch".into(),
            free_bytes: 300 << 20,
            writable: true,
        };
        let severities = |min_free: u64| -> Vec<Severity> {
            let limits = Limits::with_min_free(TransportKind::Local, min_free);
            diagnose(std::slice::from_ref(&node), &limits)
                .iter()
                .map(|f| f.severity)
                .collect()
        };
        assert_eq!(severities(10 << 30), [Severity::Problem]);
        assert_eq!(severities(200 << 20), Vec::<Severity>::new());
        assert_eq!(severities(0), Vec::<Severity>::new());
        assert_eq!(severities(500 << 20), [Severity::Problem]);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(bytes_text(300 << 20), "300 MiB");
        assert_eq!(bytes_text(5 << 30), "5.0 GiB");
        assert_eq!(bytes_text(81559 << 20), "80 GiB");
        assert_eq!(bytes_text(1300 << 30), "1.3 TiB");
        assert_eq!(bytes_text(12), "12 B");
    }
}
