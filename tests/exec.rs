//! The node-execution seam with real local processes: timeouts and teardown leave no
//! process behind (checked in /proc), leftovers are killed, and the remote wrapper — driven
//! here through a fake `srun` that runs it on this machine — passes argv, environment,
//! working directory and standard input through unchanged and tears the remote process
//! group down when the local side goes away.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pipette::exec::{
    run, run_with, shell_join, spawn_with, ExecError, ExecOptions, NodeCommand, SrunOptions,
    Status, Transport,
};
use proptest::prelude::*;

mod common;

use common::{alive, dying, eventually, read_pid};

fn sh(script: &str) -> NodeCommand {
    NodeCommand::new("sh").arg("-c").arg(script)
}

fn quick() -> ExecOptions {
    ExecOptions {
        grace: Duration::from_millis(500),
        ..ExecOptions::default()
    }
}

/// Processes (not zombies) whose process group is `pgid`.
fn live_members(pgid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2].parse() == Ok(pgid) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn timeout_kills_the_whole_group_even_what_ignores_term() {
    let dir = tempfile::tempdir().unwrap();
    let leader = dir.path().join("leader");
    let child = dir.path().join("child");
    let script = format!(
        "trap '' TERM; (trap '' TERM; exec sleep 1000) & echo $! > {child}; echo $$ > {leader}; wait",
        child = child.display(),
        leader = leader.display()
    );
    // The time limit must not run out before the command ignores TERM (or the test would
    // see TERM end it): on a busy machine `sh` can take longer than that to start. The
    // pid files say it got that far; if not, the run is tried again with more time.
    let mut timeout = Duration::from_millis(700);
    let (output, took) = loop {
        let start = Instant::now();
        let err =
            run_with(&Transport::Local, "node-a", &sh(&script), timeout, &quick()).unwrap_err();
        let took = start.elapsed();
        let ExecError::TimedOut { output, .. } = err else {
            panic!("{err}")
        };
        if std::fs::read_to_string(&leader).is_ok_and(|t| t.ends_with('\n')) {
            break (output, took);
        }
        assert!(
            timeout < Duration::from_secs(20),
            "the command never got going: {output:?}"
        );
        timeout *= 2;
    };
    assert_eq!(output.status, Status::Signaled(9), "TERM was ignored: KILL");
    assert!(
        took >= timeout + quick().grace,
        "KILL before the grace: {took:?}"
    );
    let pgid = read_pid(&leader);
    let sleeper = read_pid(&child);
    assert!(
        eventually(Duration::from_secs(2), || live_members(pgid).is_empty()),
        "left in group {pgid}: {:?}",
        live_members(pgid)
    );
    assert!(!alive(sleeper), "the grandchild {sleeper} survived");
}

#[test]
fn a_live_process_is_not_dying_and_a_killed_one_is() {
    let mut child = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    assert!(!dying(pid));
    child.kill().unwrap();
    assert!(dying(pid), "killed, whether or not it has run since");
    child.wait().unwrap();
    assert!(dying(pid), "reaped");
}

#[test]
fn what_a_command_leaves_behind_is_killed_when_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let child = dir.path().join("child");
    let out = run(
        &Transport::Local,
        "node-a",
        &sh(&format!(
            "sleep 1000 & echo $! > {}; echo done",
            child.display()
        )),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout_text(), "done\n");
    let sleeper = read_pid(&child);
    assert!(eventually(Duration::from_secs(2), || !alive(sleeper)));
}

#[test]
fn terminate_and_drop_stop_a_spawned_command() {
    let mut running = spawn_with(
        &Transport::Local,
        "node-a",
        &sh("exec sleep 1000"),
        &quick(),
    )
    .unwrap();
    let pgid = running.pgid();
    assert_eq!(pgid as u32, running.pid());
    assert!(running.try_status().unwrap().is_none());
    assert_eq!(running.terminate().unwrap(), Status::Signaled(15));
    assert!(live_members(pgid).is_empty());

    let running = spawn_with(
        &Transport::Local,
        "node-a",
        &sh("sleep 1000 & sleep 1000"),
        &quick(),
    )
    .unwrap();
    let pgid = running.pgid();
    std::thread::sleep(Duration::from_millis(100));
    drop(running);
    assert!(eventually(Duration::from_secs(2), || live_members(pgid).is_empty()));
}

/// A stand-in for Slurm's `srun`: skips srun's options (`-w HOST` included), records them,
/// and runs the command on this machine, as a real srun runs it on the node.
fn fake_srun(dir: &Path) -> PathBuf {
    let path = dir.join("srun");
    common::write_executable(
        &path,
        &format!(
            "#!/bin/sh\n\
             : > {log}\n\
             while [ $# -gt 0 ]; do\n\
               case \"$1\" in\n\
                 -w) printf '%s\\n' \"$1\" \"$2\" >> {log}; shift 2 ;;\n\
                 -*) printf '%s\\n' \"$1\" >> {log}; shift ;;\n\
                 *) break ;;\n\
               esac\n\
             done\n\
             exec \"$@\"\n",
            log = dir.join("srun.log").display()
        ),
    );
    path
}

fn srun_transport(dir: &Path) -> Transport {
    Transport::Srun(SrunOptions {
        program: fake_srun(dir),
        extra_args: vec!["--export=ALL".into()],
    })
}

const AWKWARD: [&str; 14] = [
    "plain",
    "",
    "two words",
    "it's",
    "\"double\"",
    "$HOME",
    "`id`",
    "$(id)",
    "a;b|c&d",
    "line\nbreak",
    "back\\slash",
    "*",
    "-n",
    "ünïcødé\ttab",
];

#[test]
fn srun_runs_the_wrapper_with_argv_env_cwd_and_stdin_intact() {
    let dir = tempfile::tempdir().unwrap();
    let transport = srun_transport(dir.path());
    let work = dir.path().join("work dir");
    std::fs::create_dir(&work).unwrap();
    let command = NodeCommand::new("sh")
        .arg("-c")
        .arg("printf '%s\\0' \"$@\"; printf '%s|%s|' \"$WEIRD\" \"$(pwd)\"; cat")
        .arg("argv0")
        .args(AWKWARD)
        .env("WEIRD", "a b'c\"$x\n")
        .cwd(&work)
        .stdin(b"bytes\0with\nanything".to_vec());
    let out = run(&transport, "gpu07", &command, Duration::from_secs(20)).unwrap();
    assert!(out.status.success(), "{}", out.stderr_text());
    let expected_args: String = AWKWARD.iter().map(|a| format!("{a}\0")).collect();
    let expected = format!(
        "{expected_args}a b'c\"$x\n|{}|bytes\0with\nanything",
        work.display()
    );
    assert_eq!(out.stdout_text(), expected);
    let log = std::fs::read_to_string(dir.path().join("srun.log")).unwrap();
    assert_eq!(
        log,
        "--nodes=1\n--ntasks=1\n--overlap\n-w\ngpu07\n--export=ALL\n"
    );
}

#[test]
fn srun_exit_codes_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &srun_transport(dir.path()),
        "gpu07",
        &sh("echo bad >&2; exit 7"),
        Duration::from_secs(20),
    )
    .unwrap();
    assert_eq!(out.status, Status::Exited(7));
    assert_eq!(out.stderr_text(), "bad\n");
    let out = run(
        &srun_transport(dir.path()),
        "gpu07",
        &NodeCommand::new("/nonexistent/program"),
        Duration::from_secs(20),
    )
    .unwrap();
    assert_eq!(out.status, Status::Exited(127));
}

/// The remote side runs in a session of its own; closing its standard input (a timeout),
/// or the local side dying, must still end it.
#[test]
fn remote_wrapper_tears_its_process_group_down() {
    let dir = tempfile::tempdir().unwrap();
    let transport = srun_transport(dir.path());
    for how in ["timeout", "drop"] {
        let leader = dir.path().join(format!("{how}.leader"));
        let child = dir.path().join(format!("{how}.child"));
        let command = sh(&format!(
            "trap '' TERM; sleep 1000 & echo $! > '{}'; echo $$ > '{}'; wait; wait",
            child.display(),
            leader.display()
        ));
        let options = ExecOptions {
            grace: Duration::from_secs(1),
            ..ExecOptions::default()
        };
        let start = Instant::now();
        if how == "timeout" {
            let err = run_with(
                &transport,
                "gpu07",
                &command,
                Duration::from_millis(800),
                &options,
            )
            .unwrap_err();
            assert!(matches!(err, ExecError::TimedOut { .. }), "{err}");
            let ExecError::TimedOut { output, .. } = err else {
                unreachable!()
            };
            // The wrapper reports the KILL its watchdog sent: 128 + 9.
            assert_eq!(output.status, Status::Exited(137), "{output:?}");
        } else {
            let running = spawn_with(&transport, "gpu07", &command, &options).unwrap();
            let remote_group = read_pid(&leader);
            // The fake srun runs the wrapper in our process group (a real srun's tasks run
            // under slurmstepd, never in it), so the TERM that dropping srun sends would
            // also end a watchdog that has not yet left the group: on a busy machine the
            // command can be up well before its watchdog is. Drop once it is on its own.
            assert!(
                eventually(Duration::from_secs(10), || watchdog_on_its_own(
                    remote_group
                )),
                "the watchdog of {remote_group} never started"
            );
            drop(running);
        }
        let remote_group = read_pid(&leader);
        let sleeper = read_pid(&child);
        assert!(
            eventually(Duration::from_secs(5), || live_members(remote_group)
                .is_empty()),
            "{how}: left in the remote group {remote_group}: {:?}",
            live_members(remote_group)
        );
        assert!(!alive(sleeper), "{how}: {sleeper} survived");
        // The command would sleep 1000 s: that it is gone is what shows the teardown.
        // How soon depends on the machine's load; not before the grace period anyway.
        assert!(
            start.elapsed() >= options.grace,
            "{how}: {:?}",
            start.elapsed()
        );
    }
}

/// Whether the wrapper's watchdog for the remote process group `group` runs in a session of
/// its own (the wrapper starts it with `setsid`).
fn watchdog_on_its_own(group: i32) -> bool {
    let group = group.to_string();
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            return false;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let words: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if !words.contains(&b"pipette-watch".as_slice()) || !words.contains(&group.as_bytes()) {
            return false;
        }
        // "pid (comm) state ppid pgrp session ...".
        std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
            let rest = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
            rest.split_whitespace().nth(3) == Some(pid.to_string().as_str())
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the words, `sh` splits the quoted line back into exactly them.
    #[test]
    fn shell_join_survives_sh(words in prop::collection::vec("[^\\x00]{0,12}", 0..6)) {
        let line = shell_join(&words);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("for w in {line}; do printf '%s\\0' \"$w\"; done"))
            .output()
            .unwrap();
        prop_assert!(out.status.success());
        let got: Vec<String> = String::from_utf8(out.stdout).unwrap().split_terminator('\0').map(str::to_owned).collect();
        prop_assert_eq!(got, words);
    }
}
