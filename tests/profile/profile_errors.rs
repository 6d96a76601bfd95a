//! How profiling fails: an unreachable node (exit code 68 later), a probe that fails on
//! one node (every other node is stopped at once, the failing node and its error named),
//! a probe that hangs (stopped at the time limit), and in every case the probe's temporary
//! directories removed and no process left behind. A stand-in torchrun plays the probe.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pipette::exec::{SshOptions, Transport};
use pipette::measure::{run_profile, NoProgress, ProfileOptions, ProfileRunError};

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rfind(')').is_some_and(|i| !s[i + 2..].starts_with('Z')))
}

/// A torchrun stand-in: records its pid and the probe's directory under `dir`, then
/// fails with a Python-like traceback on node rank `fail_rank`, sleeps elsewhere.
/// How long the fake torchrun hangs on every rank that does not fail.
const HANG_SECONDS: u64 = 1000;

fn fake_torchrun(dir: &Path, fail_rank: Option<u32>) -> PathBuf {
    let path = dir.join("torchrun");
    let fail = fail_rank.map_or("-1".to_owned(), |r| r.to_string());
    common::write_executable(
        &path,
        &format!(
            r#"#!/bin/sh
rank=""
script=""
for a in "$@"; do
  case "$a" in
    --node-rank=*) rank="${{a#--node-rank=}}" ;;
    */bandwidth.py) script="$a" ;;
  esac
done
echo $$ > '{dir}/pid.'"$rank"
dirname "$script" > '{dir}/stage.'"$rank"
if [ "$rank" = "{fail}" ]; then
  sleep 0.5
  echo 'Traceback (most recent call last):' >&2
  echo 'RuntimeError: Connection refused by the master' >&2
  echo 'torch.distributed.elastic.multiprocessing.errors.ChildFailedError: boom' >&2
  exit 1
fi
exec sleep {HANG_SECONDS}
"#,
            dir = dir.display()
        ),
    );
    path
}

fn options(torchrun: &Path) -> ProfileOptions {
    ProfileOptions {
        transport: Transport::Local,
        nproc_per_node: Some(1),
        torchrun: torchrun.to_string_lossy().into_owned(),
        grace: Duration::from_millis(500),
        probe_timeout: Duration::from_secs(60),
        cache: None,
        ..ProfileOptions::default()
    }
}

fn wait_for(path: &Path) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text.trim().to_owned();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} never written", path.display());
}

fn assert_cleaned_up(dir: &Path, nodes: u32) {
    for rank in 0..nodes {
        let pid: i32 = wait_for(&dir.join(format!("pid.{rank}"))).parse().unwrap();
        assert!(!alive(pid), "torchrun of node {rank} ({pid}) survived");
        let stage = wait_for(&dir.join(format!("stage.{rank}")));
        assert!(stage.contains("pipette-probe."), "{stage}");
        assert!(!Path::new(&stage).exists(), "{stage} was not removed");
    }
}

#[test]
fn a_failing_node_stops_the_others_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let torchrun = fake_torchrun(dir.path(), Some(1));
    let options = options(&torchrun);
    let start = Instant::now();
    let err = run_profile(
        &common::host_spec(&["node-a", "node-b", "node-c"]),
        &options,
        &NoProgress,
    )
    .unwrap_err();
    // The others were stopped, not left to the probe's time limit (how much sooner
    // depends on the machine's load).
    assert!(
        start.elapsed() < options.probe_timeout,
        "{:?}",
        start.elapsed()
    );
    let text = err.to_string();
    assert!(
        text.starts_with(
            "the probe failed on node-b (torchrun: exit code 1): RuntimeError: Connection \
             refused by the master (check that PyTorch is installed there"
        ),
        "{text}"
    );
    assert!(!err.is_unreachable());
    assert_cleaned_up(dir.path(), 3);
}

#[test]
fn a_hung_probe_is_stopped_at_the_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    let torchrun = fake_torchrun(dir.path(), None);
    let mut options = options(&torchrun);
    options.probe_timeout = Duration::from_secs(2);
    let start = Instant::now();
    let err = run_profile(
        &common::host_spec(&["node-a", "node-b"]),
        &options,
        &NoProgress,
    )
    .unwrap_err();
    // Far below the hang: the probe was stopped at its limit, not waited for (how soon
    // after the limit depends on how busy the machine is).
    assert!(
        start.elapsed() < Duration::from_secs(HANG_SECONDS / 2),
        "the hung probe was waited for: {:?}",
        start.elapsed()
    );
    assert!(
        matches!(err, ProfileRunError::ProbeTimedOut { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("the probe did not finish within 2 s on node-a, node-b"),
        "{err}"
    );
    assert_cleaned_up(dir.path(), 2);
}

#[test]
fn a_missing_torchrun_says_so() {
    let mut options = options(Path::new("/nonexistent/torchrun"));
    options.probe_timeout = Duration::from_secs(20);
    let err = run_profile(&common::host_spec(&["node-a"]), &options, &NoProgress).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot start /nonexistent/torchrun for node-a: "),
        "{err}"
    );
}

#[test]
fn an_unreachable_node_is_reported_as_such() {
    // Nobody listens there: the connection is refused.
    let port = common::free_port();
    let options = ProfileOptions {
        transport: Transport::Ssh(SshOptions {
            port: Some(port),
            extra_args: vec!["-F".into(), "/dev/null".into()],
            ..SshOptions::default()
        }),
        cache: None,
        ..ProfileOptions::default()
    };
    let err = run_profile(&common::host_spec(&["127.0.0.1"]), &options, &NoProgress).unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert_eq!(
        err.to_string(),
        "ssh to 127.0.0.1 failed: Connection refused (check that sshd runs there and the host \
         name resolves)"
    );
}
