//! The job-script examples (examples/slurm, examples/kubernetes) hold what a real cluster
//! needs: the sbatch files pass `sbatch --test-only` on a throwaway loopback Slurm (see
//! `common::Slurm`) and carry whole nodes, every core, the environment's activation, the
//! pre-emption warning and checkpoints on shared storage; the Kubernetes manifests parse
//! and give every pod a memory-backed /dev/shm, the shared data and checkpoint volumes and
//! the job secret.
//!
//! Requires Debian's Slurm and munge (as the srun transport tests) and Debian's
//! python3-yaml (`scripts/install-test-deps` installs them); the tests fail, never skip,
//! without them.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

mod common;

use common::{repo, Slurm};

/// The `#SBATCH` options of a job script, in order.
fn sbatch_directives(script: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|l| l.strip_prefix("#SBATCH "))
        .map(|o| o.trim().to_owned())
        .collect()
}

/// The checks every sbatch example passes; `script` is the file's text.
fn assert_ready_for_a_real_cluster(name: &str, script: &str) {
    let directives = sbatch_directives(script);
    for want in ["--exclusive", "--ntasks-per-node=1", "--signal=B:USR1@120"] {
        assert!(
            directives.iter().any(|d| d == want),
            "{name} lacks #SBATCH {want}: {directives:?}"
        );
    }
    assert!(
        directives.iter().any(|d| d.starts_with("--cpus-per-task=")),
        "{name} lacks #SBATCH --cpus-per-task: {directives:?}"
    );
    // srun does not inherit --cpus-per-task since Slurm 22.05: the steps need this.
    assert!(
        script.contains("export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK"),
        "{name} does not pass --cpus-per-task on to its steps"
    );
    assert!(
        script.contains("source \"$HOME/venvs/megatron/bin/activate\""),
        "{name} does not activate the environment"
    );
    // B:USR1 reaches the batch shell only: the shell must be what passes it on.
    let launch = script
        .lines()
        .find(|l| l.contains("pipette-run --nproc-per-node"))
        .unwrap_or_else(|| panic!("{name} never runs pipette-run"));
    assert!(
        launch.starts_with("exec "),
        "{name}: USR1 goes to the batch shell, so pipette-run (or srun) must replace it: {launch}"
    );
    assert!(
        script.contains("CKPT=$SCRATCH/") && script.contains("--save \"$CKPT\" --load \"$CKPT\""),
        "{name} does not save and load its checkpoints on shared storage"
    );
}

/// `sbatch --test-only` on the loopback cluster: the script's options parse and the
/// controller would start it. The cluster has one node and no GPUs, so the copy tried
/// drops the GPU request and asks for one node and one CPU per task on the command line
/// (which wins over the script's #SBATCH lines); every other option is the example's own.
fn assert_sbatch_accepts(slurm: &Slurm, name: &str, script: &str) {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join(name);
    let kept: Vec<&str> = script
        .lines()
        .filter(|l| !l.starts_with("#SBATCH --gpus-per-node="))
        .collect();
    std::fs::write(&copy, kept.join("\n")).unwrap();
    let out = slurm
        .command("/usr/bin/sbatch")
        .args(["--test-only", "--nodes=1", "--cpus-per-task=1"])
        .arg(&copy)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("to start at"),
        "sbatch --test-only refused {name} ({}): {stderr}\n{}",
        out.status,
        slurm.logs()
    );
}

#[test]
fn sbatch_examples_are_accepted_and_hold_what_a_real_cluster_needs() {
    let slurm = Slurm::start();
    for name in ["one-driver.sbatch", "one-copy-per-node.sbatch"] {
        let path = repo().join("examples/slurm").join(name);
        let script = std::fs::read_to_string(&path).unwrap();
        let syntax = Command::new("bash").arg("-n").arg(&path).output().unwrap();
        assert!(
            syntax.status.success(),
            "{name} is not valid bash: {}",
            String::from_utf8_lossy(&syntax.stderr)
        );
        assert_ready_for_a_real_cluster(name, &script);
        assert_sbatch_accepts(&slurm, name, &script);
    }
    // GB200 NVL72 (issue 30): the 16 trays in one segment of one block, one NVLink
    // domain. The loopback Slurm (Debian's 22.05) predates `--segment` (Slurm 24.11,
    // topology/block), so sbatch judges every other directive of the script.
    let name = "gb200-nvl72.sbatch";
    let path = repo().join("examples/slurm").join(name);
    let script = std::fs::read_to_string(&path).unwrap();
    assert!(Command::new("bash")
        .arg("-n")
        .arg(&path)
        .status()
        .unwrap()
        .success());
    assert_ready_for_a_real_cluster(name, &script);
    let directives = sbatch_directives(&script);
    assert!(
        directives.iter().any(|d| d == "--segment=16"),
        "{name} does not keep its nodes in one NVLink domain: {directives:?}"
    );
    assert!(directives.iter().any(|d| d == "--nodes=16"));
    let older: String = script
        .lines()
        .filter(|l| !l.starts_with("#SBATCH --segment"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_sbatch_accepts(&slurm, name, &older);
    let copies =
        std::fs::read_to_string(repo().join("examples/slurm/one-copy-per-node.sbatch")).unwrap();
    assert!(copies.contains("export PIPETTE_JOB_SECRET=$(head -c 32 /dev/urandom | base64)"));
}

/// The documents of a YAML file, as JSON, read by Debian's PyYAML (safe_load: anchors and
/// aliases resolved, nothing executed).
fn yaml_documents(path: &Path) -> Vec<Value> {
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sys, yaml\n\
             print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(path)
        .output()
        .expect("/usr/bin/python3 (with Debian's python3-yaml) runs");
    assert!(
        out.status.success(),
        "{} does not parse as YAML: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The volume mounted at `mount` in `container`, looked up in the pod's `volumes`.
fn volume_at<'a>(volumes: &'a Value, container: &Value, mount: &str) -> &'a Value {
    let mounts = container["volumeMounts"].as_array().expect("volumeMounts");
    let name = mounts
        .iter()
        .find(|m| m["mountPath"] == mount)
        .unwrap_or_else(|| panic!("nothing mounted at {mount}: {mounts:?}"))["name"]
        .clone();
    volumes
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name} for {mount}"))
}

/// A pod as the examples need it: /dev/shm memory-backed, /ckpt and /data on claims every
/// pod shares.
fn assert_pod_volumes(what: &str, volumes: &Value, container: &Value) {
    let shm = volume_at(volumes, container, "/dev/shm");
    assert_eq!(
        shm["emptyDir"]["medium"], "Memory",
        "{what}: /dev/shm {shm}"
    );
    for mount in ["/ckpt", "/data"] {
        let v = volume_at(volumes, container, mount);
        assert!(
            v["persistentVolumeClaim"]["claimName"].is_string(),
            "{what}: {mount} is not on a shared claim: {v}"
        );
    }
}

/// The job secret comes from the Secret of secret.yaml.
fn assert_secret(what: &str, env: &Value, secret: &Value) {
    let entry = env
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "PIPETTE_JOB_SECRET")
        .unwrap_or_else(|| panic!("{what} has no PIPETTE_JOB_SECRET"));
    let key = &entry["valueFrom"]["secretKeyRef"];
    assert_eq!(key["name"], secret["metadata"]["name"], "{what}: {entry}");
    let key_name = key["key"].as_str().expect("secret key");
    assert!(
        secret["stringData"][key_name].is_string(),
        "{what}: secret.yaml has no key {key_name}"
    );
}

/// The arguments save and load under /ckpt and read data under /data.
fn assert_uses_the_volumes(what: &str, args: &str) {
    for want in ["--save", "--load"] {
        assert!(
            args.contains(&format!("{want} /ckpt")) || args.contains(&format!("{want}=/ckpt")),
            "{what}: {want} is not on /ckpt: {args}"
        );
    }
    assert!(args.contains("/data/"), "{what}: data not under /data");
}

#[test]
fn kubernetes_examples_mount_shm_shared_volumes_and_the_secret() {
    let dir = repo().join("examples/kubernetes");
    let secret = &yaml_documents(&dir.join("secret.yaml"))[0];
    assert_eq!(secret["kind"], "Secret");

    let job = &yaml_documents(&dir.join("pytorchjob.yaml"))[0];
    assert_eq!(job["kind"], "PyTorchJob");
    let replicas = &job["spec"]["pytorchReplicaSpecs"];
    for role in ["Master", "Worker"] {
        let pod = &replicas[role]["template"]["spec"];
        let container = &pod["containers"][0];
        let what = format!("pytorchjob.yaml {role}");
        assert_pod_volumes(&what, &pod["volumes"], container);
        assert_secret(&what, &container["env"], secret);
        assert_uses_the_volumes(&what, &container["args"].to_string());
    }

    let job = &yaml_documents(&dir.join("trainjob.yaml"))[0];
    assert_eq!(job["kind"], "TrainJob");
    let overrides = job["spec"]["podTemplateOverrides"]
        .as_array()
        .expect("podTemplateOverrides");
    let node = overrides
        .iter()
        .find(|o| {
            o["targetJobs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["name"] == "node")
        })
        .expect("an override for the runtime's node job");
    let container = node["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "node")
        .expect("an override for the node container");
    assert_pod_volumes("trainjob.yaml", &node["spec"]["volumes"], container);
    let trainer = &job["spec"]["trainer"];
    assert_secret("trainjob.yaml", &trainer["env"], secret);
    assert_uses_the_volumes("trainjob.yaml", &trainer["args"].to_string());
}

/// The degraded example cluster's dry run says what its slow links cost and what its
/// iteration time comes to, and its run directory's README names every file it holds.
#[test]
fn the_degraded_example_dry_run_names_its_slow_link_and_its_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let run_dir_arg = run_dir.display().to_string();
    let out = common::run_clean(
        "pipette-run",
        &[
            "--cluster",
            "examples/clusters/a100-4x8-degraded.json",
            "--model",
            "llama2-13b",
            "--dry-run",
            "--run-dir",
            &run_dir_arg,
            "examples/pretrain_gpt.py",
            "--global-batch-size",
            "256",
            "--bf16",
            "--train-iters",
            "1000",
        ],
    );
    // Wrapped lines read as one.
    let text = out.split_whitespace().collect::<Vec<_>>().join(" ");
    for want in [
        "On the critical path: the pipeline hop stage 2 -> 3 (a100-n02 -> a100-n03) runs over a 13.7 GB/s link",
        "tokens/s (",
        "per GPU), MFU ",
        "% of the GPUs' datasheet peak (312 TFLOP/s each)",
        "GPU-hours per billion tokens; --train-iters 1000: ",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{out}");
    }
    let mfu: f64 = text
        .split("MFU ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(mfu > 0.0 && mfu < 100.0, "MFU {mfu} %");
    for line in out.lines() {
        assert!(line.chars().count() <= 100, "over 100 columns: {line}");
    }

    let readme = std::fs::read_to_string(run_dir.join("README.md")).unwrap();
    let mut files = 0;
    for entry in std::fs::read_dir(&run_dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        files += 1;
        assert!(
            readme.contains(&format!("- `{name}`: ")),
            "README.md does not say what {name} is:\n{readme}"
        );
    }
    assert!(
        files >= 10,
        "4 launch scripts, the pictures and the plan: {files} files"
    );
}

/// scripts/demo says every DEMO_HEARTBEAT_S (20 s when run) that a silent step (pip's
/// install, the quiet release build) still runs, then how long it took.
#[test]
fn the_demo_reports_a_silent_step_while_it_runs() {
    let out = Command::new(repo().join("scripts/demo"))
        .args(["--heartbeat-self-test", "7"])
        .env("DEMO_HEARTBEAT_S", "2")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let beats = err.matches("demo: a silent step: still at it, ").count();
    // At least one beat in 7 s at 2 s apart, however loaded the machine.
    assert!(beats >= 1, "no heartbeat:\n{err}");
    assert!(err.contains("demo: a silent step took "), "{err}");
}
