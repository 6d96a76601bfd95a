//! One pipette-run per task of a real Slurm step (Debian's slurmctld, slurmd and munge).
//!
//! - On a three-node Slurm made on this machine (three network namespaces we create, each a
//!   node with its own address on a bridge, its own slurmd, and a hosts file naming the
//!   nodes), `srun --ntasks-per-node=1 pipette-run ...` over the three makes one job: one
//!   plan, one torchrun per node, one run directory, trained to the end, every task exiting
//!   with the job's code and nothing left running; `--dry-run` in the same step prints one
//!   plan, the leader's, and the agents say they follow it.
//! - On the one-node test Slurm (`common::Slurm`): a step with more tasks than nodes — a
//!   task per GPU, as NVIDIA's recipes write it — is refused by every task before anything
//!   runs, with the srun line to write instead; a one-task step is the single driver it
//!   always was.
//!
//! Requires what tests/exec_slurm.rs requires, root (to make network namespaces), `ip`,
//! `nsenter` and `unshare`, and the venv of `scripts/setup-megatron-venv`; fails, never
//! skips, without them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    assert_no_process_left, cpu_job_command, cpu_profile, kill_slurm_leftovers, node_state,
    torchrun, wait_for_daemons, Daemon, Slurm, TINY_MODEL,
};
use pipette::supervise::events::read_events;

fn srun_pipette(slurm: &Slurm, job: &str, tasks: &str) -> std::process::Output {
    Command::new(slurm.srun_in(job))
        .args(["--nodes=1", tasks])
        .arg(env!("CARGO_BIN_EXE_pipette-run"))
        .args(["--dry-run", "--json", "train.py"])
        .args(TINY_MODEL)
        .env_remove("PIPETTE_JOB_SECRET")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_step_with_a_task_per_gpu_is_refused_before_anything_runs() {
    let slurm = Slurm::start();
    let job = slurm.allocate();
    let out = srun_pipette(&slurm, &job, "--ntasks=2");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // srun exits with the tasks' code: the node list's.
    assert_eq!(out.status.code(), Some(66), "{stderr}\n{}", slurm.logs());
    let refusal = "pipette-run: error: this Slurm step runs 2 tasks on 1 node, but pipette-run \
                   runs once per node and starts the processes of every GPU itself (write the \
                   step as `srun --nodes=1 --ntasks-per-node=1 pipette-run --nproc-per-node=2 ...`)";
    assert_eq!(
        common::unstamped_log(&stderr)
            .lines()
            .filter(|l| *l == refusal)
            .count(),
        2,
        "each task says it, in one line:\n{stderr}"
    );
    // Under --json each task's error is also the error object on stdout, and nothing else
    // is there: nothing was planned.
    let objects: Vec<serde_json::Value> = serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("stdout is JSON objects");
    assert_eq!(objects.len(), 2, "{objects:?}");
    for error in &objects {
        assert_eq!(error["schema"], "pipette-error/1");
        assert_eq!(error["exit_code"], 66);
        assert_eq!(
            Some(error["error"].as_str().unwrap()),
            refusal.strip_prefix("pipette-run: error: ")
        );
    }

    // One task: the single driver, as before.
    let out = srun_pipette(&slurm, &job, "--ntasks=1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["nodes"]["source"]["kind"], "slurm");
}

const NODES: [&str; 3] = ["pn1", "pn2", "pn3"];
const ADDRS: [&str; 3] = ["10.201.0.11", "10.201.0.12", "10.201.0.13"];
const BRIDGE_ADDR: &str = "10.201.0.1";

/// A three-node Slurm on this machine: a bridge, three network namespaces wired to it, a
/// slurmd in each (in a mount namespace of its own whose /etc/hosts names the nodes), and
/// munged and slurmctld here. Everything is removed on drop.
struct NetSlurm {
    daemons: Vec<Daemon>,
    conf: PathBuf,
    dir: tempfile::TempDir,
    tag: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl NetSlurm {
    fn start() -> NetSlurm {
        let dir = tempfile::Builder::new()
            .prefix("pipette-netslurm.")
            .tempdir()
            .unwrap();
        let tag = format!("{}", std::process::id() % 100_000);
        let mut slurm = NetSlurm {
            daemons: Vec::new(),
            conf: dir.path().join("slurm.conf"),
            dir,
            tag,
        };
        let d = slurm.dir.path().to_path_buf();
        let bridge = slurm.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{BRIDGE_ADDR}/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (node, addr) in NODES.iter().zip(ADDRS) {
            hosts.push_str(&format!("{addr} {node}\n"));
        }
        std::fs::write(d.join("hosts"), hosts).unwrap();
        for (k, addr) in ADDRS.iter().enumerate() {
            let (ns, outer) = (slurm.netns(k), format!("pv{}h{k}", slurm.tag));
            ip(&["netns", "add", &ns]);
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip(&["link", "set", &outer, "master", &bridge]);
            ip(&["link", "set", &outer, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        for sub in ["state", "spool-pn1", "spool-pn2", "spool-pn3"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("plugstack.conf"), "").unwrap();
        let mut conf = common::slurm_conf_head(
            &d,
            BRIDGE_ADDR,
            common::free_port(),
            common::free_port(),
            "-%n",
        );
        for (node, addr) in NODES.iter().zip(ADDRS) {
            conf.push_str(&format!(
                "NodeName={node} NodeAddr={addr} CPUs=2 RealMemory=100 State=UNKNOWN\n"
            ));
        }
        conf.push_str("PartitionName=debug Nodes=pn[1-3] Default=YES MaxTime=INFINITE State=UP\n");
        std::fs::write(&slurm.conf, conf).unwrap();
        slurm.daemons.push(Slurm::start_munged(&d));
        slurm.daemons.push(Daemon::start(
            Command::new("/usr/sbin/slurmctld")
                .arg("-D")
                .env("SLURM_CONF", &slurm.conf),
            d.join("slurmctld.out"),
        ));
        for (k, node) in NODES.iter().enumerate() {
            // nsenter switches only the network namespace (`ip netns exec` would mount a
            // sysfs without the cgroup tree slurmd needs); unshare gives the node its own
            // /etc/hosts.
            let script = format!(
                "mount --bind '{}' /etc/hosts && exec /usr/sbin/slurmd -D -N {node}",
                d.join("hosts").display()
            );
            slurm.daemons.push(Daemon::start(
                Command::new("nsenter")
                    .arg(format!("--net=/run/netns/{}", slurm.netns(k)))
                    .args(["unshare", "-m", "sh", "-c", &script])
                    .env("SLURM_CONF", &slurm.conf),
                d.join(format!("slurmd-{node}.out")),
            ));
        }
        let conf = slurm.conf.clone();
        let mut daemons: Vec<&mut Daemon> = slurm.daemons.iter_mut().collect();
        let idle = wait_for_daemons(&mut daemons, Duration::from_secs(60), || {
            node_state(&conf).as_deref() == Some("idle\nidle\nidle")
        });
        assert!(
            idle,
            "the three nodes never came up idle:\n{}",
            slurm.logs()
        );
        slurm
    }

    fn bridge(&self) -> String {
        format!("pb{}", self.tag)
    }

    fn netns(&self, k: usize) -> String {
        format!("pipette-{}-{}", self.tag, NODES[k])
    }

    fn logs(&self) -> String {
        let mut text = String::new();
        for name in [
            "slurmctld.log",
            "slurmd-pn1.log",
            "slurmd-pn2.log",
            "slurmd-pn3.log",
            "slurmd-pn1.out",
        ] {
            text.push_str(&format!(
                "--- {name}\n{}\n",
                common::log_tail(&self.dir.path().join(name))
            ));
        }
        text
    }

    /// `srun` over the three nodes, one task each, running pipette-run from the
    /// repository with `args`; the job's files in `dir`, its run directory `dir/run`.
    fn srun_pipette(&self, dir: &Path, run: &str, args: &[&str]) -> std::process::Output {
        let mut command = cpu_job_command("/usr/bin/srun");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SLURM_") {
                command.env_remove(name);
            }
        }
        command
            .env("SLURM_CONF", &self.conf)
            .env("GLOO_SOCKET_IFNAME", "eth0")
            .env("PIPETTE_JOB_SECRET", "slurm-job-secret-0123456789")
            .args(["--nodes=3", "--ntasks-per-node=1", "--immediate=30"])
            .arg(env!("CARGO_BIN_EXE_pipette-run"))
            .arg("--cluster")
            .arg(dir.join("cluster.json"))
            .args(["--nproc-per-node", "2", "--pin", "tp=1,pp=1"])
            .arg("--run-dir")
            .arg(dir.join(run))
            .arg("--torchrun")
            .arg(torchrun())
            .args(["--grace", "3s", "--no-trial"])
            .args(args)
            .arg("examples/train_gpt.py")
            .args(common::tiny_gpt_args(8, 4))
            .arg("--save")
            .arg(dir.join("save"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

impl Drop for NetSlurm {
    fn drop(&mut self) {
        self.daemons.clear();
        kill_slurm_leftovers(&self.conf);
        for k in 0..NODES.len() {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.netns(k)])
                .output();
            let _ = Command::new("ip")
                .args(["link", "del", &format!("pv{}h{k}", self.tag)])
                .output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge()])
            .output();
    }
}

#[test]
fn srun_with_a_copy_per_node_on_three_nodes_makes_one_job() {
    let slurm = NetSlurm::start();
    let job = tempfile::Builder::new()
        .prefix("pipette-slurm-copies-")
        .tempdir()
        .unwrap();
    std::fs::write(job.path().join("cluster.json"), cpu_profile(&NODES, 2)).unwrap();

    // The dry run: one plan, the leader's; the agents follow it.
    let out = slurm.srun_pipette(job.path(), "dry-run", &["--dry-run", "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{}", slurm.logs());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "one JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(
        report["nodes"]["source"]["kind"], "copies",
        "{}",
        report["nodes"]
    );
    assert_eq!(report["nodes"]["hosts"].as_array().map(Vec::len), Some(3));
    for (rank, node) in NODES.iter().enumerate().skip(1) {
        assert!(
            stderr.contains(&format!(
                "pipette-run: node rank {rank} ({node}) follows the leader on pn1"
            )),
            "{stderr}"
        );
    }

    // The job, trained to the end.
    let started = Instant::now();
    let out = slurm.srun_pipette(job.path(), "run", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{}", slurm.logs());
    eprintln!("the three-node job took {:?}", started.elapsed());
    let events = read_events(&job.path().join("run/events.jsonl")).unwrap();
    let launches: Vec<_> = events.iter().filter(|e| e["event"] == "launch").collect();
    assert_eq!(launches.len(), 1, "{events:?}");
    assert_eq!(launches[0]["transport"], "agent");
    let hosts: Vec<&str> = launches[0]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, NODES, "{}", launches[0]);
    let exit: Vec<_> = events.iter().filter(|e| e["event"] == "exit").collect();
    assert_eq!(exit[0]["code"], 0);
    assert_eq!(
        stderr
            .matches("pipette-run: the leader ended the job with exit code 0")
            .count(),
        2,
        "both agents exit with the job's code:\n{stderr}"
    );
    // Six workers over the three nodes; each node's output came back through its copy into
    // the node's log (only rank 0 prints iterations).
    assert_eq!(launches[0]["config"]["dp"], 6);
    for node in NODES {
        let log = job.path().join(format!("run/logs/{node}.log"));
        assert!(log.exists(), "no log of {node}");
    }
    let saved =
        std::fs::read_to_string(job.path().join("save/latest_checkpointed_iteration.txt")).unwrap();
    assert_eq!(saved.trim(), "8", "trained to the end");
    // One run directory (besides the dry run's): the leader's.
    let runs: Vec<_> = std::fs::read_dir(job.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("events.jsonl").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(runs, ["run"]);
    assert_no_process_left(&job.path().display().to_string());
}
