//! One copy of pipette-run per node: whether this process is one of several copies started
//! together (where torchrun would run: `srun --ntasks-per-node=1 pipette-run ...`, or one
//! Kubernetes pod each with `PET_*` set), which one, and where the leader is.
//!
//! Owns reading the patterns from the [`Environment`] (never the process environment) and
//! refusing the layouts pipette-run cannot serve; knows nothing of how copies talk.
//!
//! Patterns, first match wins:
//! 1. **A Slurm step with several tasks**: `SLURM_STEP_NUM_TASKS` > 1 (set by `srun` for
//!    the tasks of a step, not in a batch script itself). This copy is task
//!    `SLURM_PROCID`; task 0 leads, and Slurm's default block distribution starts it on the
//!    first node of `SLURM_STEP_NODELIST`, which is where the others find it. The step must
//!    run one task per node (`SLURM_STEP_NUM_NODES` = `SLURM_STEP_NUM_TASKS`): a step with
//!    a task per GPU (NVIDIA's recipes use `--ntasks-per-node=8`) is refused before anything
//!    runs, with the line to write instead, because every copy would start a torchrun for
//!    its whole node. This node's name is `--local-addr`, else `SLURMD_NODENAME`.
//! 2. **Pods**: `PET_NNODES` and `PET_NODE_RANK` set (Kubeflow's PyTorchJob and Trainer
//!    set them, with `PET_MASTER_ADDR` and `PET_MASTER_PORT`), for a fixed node count above
//!    one (`--nnodes`, which reads `PET_NNODES`). This copy is node rank `PET_NODE_RANK`;
//!    rank 0 leads, at `--master-addr` (`PET_MASTER_ADDR`). This node's name is
//!    `--local-addr`, else the address its connection to the leader comes from.
//!
//! Anything else is a single driver, as before.

use super::allocation::NodeRange;
use super::discover::{DiscoveryError, Environment};
use super::hostlist;

/// This process is one of `count` copies of pipette-run, one per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copies {
    pub pattern: Pattern,
    /// How many copies (nodes).
    pub count: u32,
    /// Which copy this is; 0 leads.
    pub rank: u32,
    /// Where the leader is: a host name or address this node can resolve.
    pub leader: String,
    /// This node's name as the other nodes reach it, when the environment says.
    pub name: Option<String>,
}

/// How the copies were started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Tasks of one Slurm job step.
    SlurmStep { job_id: Option<String> },
    /// Pods (or other processes) with torchrun's `PET_*` variables.
    Pods,
}

/// The role of this copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Discovers, profiles, plans, launches and supervises, through the others.
    Leader,
    /// Runs its node's part on the leader's orders.
    Agent { rank: u32 },
}

impl Copies {
    pub fn role(&self) -> Role {
        match self.rank {
            0 => Role::Leader,
            rank => Role::Agent { rank },
        }
    }
}

impl Pattern {
    /// The pattern in words, for messages.
    pub fn describe(&self) -> &'static str {
        match self {
            Pattern::SlurmStep { .. } => "one task per node of a Slurm step",
            Pattern::Pods => "one pod per node (PET_NNODES, PET_NODE_RANK)",
        }
    }
}

/// What the command line says about the copies (torchrun's options, which also read
/// `PET_NNODES`, `PET_MASTER_ADDR` and `PET_LOCAL_ADDR`).
#[derive(Debug, Clone, Default)]
pub struct CopiesRequest {
    pub nnodes: Option<NodeRange>,
    pub master_addr: Option<String>,
    pub local_addr: Option<String>,
}

/// Whether this process is one of several copies (see the module doc); `None`: a single
/// driver.
pub fn detect(
    env: &Environment,
    request: &CopiesRequest,
) -> Result<Option<Copies>, DiscoveryError> {
    if let Some(tasks) = variable(env, "SLURM_STEP_NUM_TASKS") {
        let tasks = count("SLURM_STEP_NUM_TASKS", tasks)?;
        if tasks > 1 {
            return slurm_step(env, request, tasks).map(Some);
        }
    }
    if variable(env, "PET_NNODES").is_some() && variable(env, "PET_NODE_RANK").is_some() {
        return pods(env, request);
    }
    Ok(None)
}

fn slurm_step(
    env: &Environment,
    request: &CopiesRequest,
    tasks: u32,
) -> Result<Copies, DiscoveryError> {
    let nodes = required(env, "SLURM_STEP_NUM_NODES")?;
    let nodes = count("SLURM_STEP_NUM_NODES", nodes)?;
    if tasks != nodes {
        let per_node = if nodes > 0 && tasks % nodes == 0 {
            format!(" --nproc-per-node={}", tasks / nodes)
        } else {
            String::new()
        };
        return Err(DiscoveryError::TasksPerNode {
            tasks,
            nodes,
            line: format!("srun --nodes={nodes} --ntasks-per-node=1 pipette-run{per_node} ..."),
        });
    }
    let rank = count("SLURM_PROCID", required(env, "SLURM_PROCID")?)?;
    let list = required(env, "SLURM_STEP_NODELIST")?;
    let hosts = hostlist::expand(list).map_err(|problem| DiscoveryError::Hostlist {
        origin: "SLURM_STEP_NODELIST".to_string(),
        list: list.to_string(),
        problem,
    })?;
    let leader = hosts
        .into_iter()
        .next()
        .ok_or_else(|| DiscoveryError::NoNodes {
            origin: "SLURM_STEP_NODELIST".to_string(),
        })?;
    let name = request
        .local_addr
        .clone()
        .or_else(|| variable(env, "SLURMD_NODENAME").map(str::to_string));
    if let Some(name) = &name {
        host_name("SLURMD_NODENAME", name)?;
    }
    host_name("SLURM_STEP_NODELIST", &leader)?;
    let job_id = variable(env, "SLURM_JOB_ID").map(str::to_string);
    Ok(Copies {
        pattern: Pattern::SlurmStep { job_id },
        count: tasks,
        rank,
        leader,
        name,
    })
}

fn pods(env: &Environment, request: &CopiesRequest) -> Result<Option<Copies>, DiscoveryError> {
    let nnodes = variable(env, "PET_NNODES").unwrap_or_default();
    let range = request.nnodes.unwrap_or(NodeRange { min: 1, max: 1 });
    if range.min != range.max {
        return Err(bad(
            "PET_NNODES",
            nnodes,
            "a range of node counts",
            "one pipette-run per pod needs a fixed node count; set PET_NNODES to the number of pods",
        ));
    }
    if range.max <= 1 {
        return Ok(None);
    }
    let rank_text = required(env, "PET_NODE_RANK")?;
    let rank = count("PET_NODE_RANK", rank_text)?;
    if rank >= range.max {
        return Err(bad(
            "PET_NODE_RANK",
            rank_text,
            &format!("not below the node count {}", range.max),
            "node ranks run from 0 to the number of pods minus one",
        ));
    }
    let leader = request.master_addr.clone().ok_or_else(|| {
        bad(
            "PET_MASTER_ADDR",
            "",
            "unset",
            "set PET_MASTER_ADDR (or --master-addr) to the address of the pod of node rank 0",
        )
    })?;
    Ok(Some(Copies {
        pattern: Pattern::Pods,
        count: range.max,
        rank,
        leader,
        name: request.local_addr.clone(),
    }))
}

/// This node's or the leader's name must be a host name as the node lists' are: it becomes
/// a node of the plan (printed, written into launch scripts), and an escape sequence in
/// `SLURMD_NODENAME` reached the dry run's output raw.
fn host_name(origin: &str, host: &str) -> Result<(), DiscoveryError> {
    match super::host_name_problem(host) {
        None => Ok(()),
        Some(problem) => Err(DiscoveryError::UnusableHostName {
            origin: origin.to_string(),
            host: super::shown_host(host),
            problem,
        }),
    }
}

fn variable<'a>(env: &'a Environment, name: &str) -> Option<&'a str> {
    env.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

fn required<'a>(env: &'a Environment, name: &str) -> Result<&'a str, DiscoveryError> {
    variable(env, name).ok_or_else(|| {
        bad(
            name,
            "",
            "unset",
            "Slurm sets it for every task of a step; run pipette-run with srun",
        )
    })
}

fn count(name: &str, value: &str) -> Result<u32, DiscoveryError> {
    value
        .parse::<u32>()
        .ok()
        .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            bad(
                name,
                value,
                "not a whole number",
                "check the job's environment",
            )
        })
}

fn bad(variable: &str, value: &str, problem: &str, hint: &str) -> DiscoveryError {
    DiscoveryError::BadVariable {
        variable: variable.to_string(),
        value: value.to_string(),
        problem: problem.to_string(),
        hint: hint.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::discover::environment as env;

    fn slurm_task(procid: &str, tasks: &str, nodes: &str) -> Environment {
        env(&[
            ("SLURM_JOB_ID", "77"),
            ("SLURM_JOB_NODELIST", "gpu[01-04]"),
            ("SLURM_STEP_NODELIST", "gpu[02-04]"),
            ("SLURM_STEP_NUM_TASKS", tasks),
            ("SLURM_STEP_NUM_NODES", nodes),
            ("SLURM_PROCID", procid),
            ("SLURMD_NODENAME", "gpu03"),
        ])
    }

    fn pods_request(nnodes: u32) -> CopiesRequest {
        CopiesRequest {
            nnodes: Some(NodeRange {
                min: nnodes,
                max: nnodes,
            }),
            master_addr: Some("job-master-0".into()),
            local_addr: None,
        }
    }

    #[test]
    fn a_single_driver_is_no_copy() {
        let none = CopiesRequest::default();
        assert_eq!(detect(&env(&[]), &none).unwrap(), None);
        // A batch script (no step), and a one-task step, are single drivers.
        let batch = env(&[("SLURM_JOB_NODELIST", "gpu[01-04]"), ("SLURM_PROCID", "0")]);
        assert_eq!(detect(&batch, &none).unwrap(), None);
        assert_eq!(detect(&slurm_task("0", "1", "1"), &none).unwrap(), None);
        // One pod alone is a single driver too.
        let pod = env(&[("PET_NNODES", "1"), ("PET_NODE_RANK", "0")]);
        assert_eq!(detect(&pod, &pods_request(1)).unwrap(), None);
    }

    #[test]
    fn slurm_tasks_one_per_node_follow_task_zero_on_the_first_step_node() {
        let copies = detect(&slurm_task("1", "3", "3"), &CopiesRequest::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            copies,
            Copies {
                pattern: Pattern::SlurmStep {
                    job_id: Some("77".into())
                },
                count: 3,
                rank: 1,
                leader: "gpu02".into(),
                name: Some("gpu03".into()),
            }
        );
        assert_eq!(copies.role(), Role::Agent { rank: 1 });
        let leader = detect(&slurm_task("0", "3", "3"), &CopiesRequest::default()).unwrap();
        assert_eq!(leader.unwrap().role(), Role::Leader);
    }

    #[test]
    fn a_task_per_gpu_is_refused_with_the_line_to_write() {
        let err = detect(&slurm_task("5", "16", "2"), &CopiesRequest::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "this Slurm step runs 16 tasks on 2 nodes, but pipette-run runs once per node \
             and starts the processes of every GPU itself (write the step as \
             `srun --nodes=2 --ntasks-per-node=1 pipette-run --nproc-per-node=8 ...`)"
        );
        let err = detect(&slurm_task("0", "3", "2"), &CopiesRequest::default()).unwrap_err();
        assert!(
            err.to_string().ends_with(
                "(write the step as `srun --nodes=2 --ntasks-per-node=1 pipette-run ...`)"
            ),
            "{err}"
        );
    }

    #[test]
    fn pods_follow_node_rank_zero_at_the_master_address() {
        let e = env(&[("PET_NNODES", "3"), ("PET_NODE_RANK", "2")]);
        let mut request = pods_request(3);
        request.local_addr = Some("10.0.0.7".into());
        let copies = detect(&e, &request).unwrap().unwrap();
        assert_eq!(
            copies,
            Copies {
                pattern: Pattern::Pods,
                count: 3,
                rank: 2,
                leader: "job-master-0".into(),
                name: Some("10.0.0.7".into()),
            }
        );
    }

    #[test]
    fn pods_without_what_they_need_say_what_to_set() {
        let e = env(&[("PET_NNODES", "2:4"), ("PET_NODE_RANK", "0")]);
        let mut request = pods_request(2);
        request.nnodes = Some(NodeRange { min: 2, max: 4 });
        let err = detect(&e, &request).unwrap_err().to_string();
        assert!(
            err.starts_with("PET_NNODES=\"2:4\": a range of node counts"),
            "{err}"
        );
        let e = env(&[("PET_NNODES", "3"), ("PET_NODE_RANK", "3")]);
        let err = detect(&e, &pods_request(3)).unwrap_err().to_string();
        assert!(
            err.starts_with("PET_NODE_RANK=\"3\": not below the node count 3"),
            "{err}"
        );
        let e = env(&[("PET_NNODES", "3"), ("PET_NODE_RANK", "1")]);
        let mut request = pods_request(3);
        request.master_addr = None;
        let err = detect(&e, &request).unwrap_err().to_string();
        assert!(err.contains("set PET_MASTER_ADDR"), "{err}");
        let e = env(&[("PET_NNODES", "3"), ("PET_NODE_RANK", "one")]);
        assert!(detect(&e, &pods_request(3)).is_err());
    }

    /// N4 (a variant): this node's name from Slurm became a node of the plan unchecked.
    #[test]
    fn n4_a_node_name_from_the_environment_is_a_host_name() {
        let mut e = slurm_task("1", "3", "3");
        e.insert("SLURMD_NODENAME".into(), "gpu03\u{1b}[2J".into());
        let err = detect(&e, &CopiesRequest::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "SLURMD_NODENAME: host \"gpu03\\u{1b}[2J\" contains a blank or a control character"
            ),
            "{err}"
        );
    }
}
