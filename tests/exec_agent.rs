//! The agent transport: a command server (what every copy of pipette-run runs) on
//! 127.0.0.2, reached through the real relay (the pipette-run binary), with the same checks
//! as the ssh and srun transports: bytes intact, exit codes and streams as given, teardown
//! reaching the node; and a relay without the job's secret runs nothing.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use pipette::exec::agent::{AgentNode, AgentOptions, CommandServer, JobSecret};
use pipette::exec::{run, ExecError, NodeCommand, Transport};

use common::{
    assert_remote_exit_code_and_streams, assert_remote_io_intact, assert_teardown_reaches_the_node,
};

const HOST: &str = "node-b";

struct Agent {
    server: CommandServer,
    log: Arc<Mutex<Vec<String>>>,
}

fn start_agent(secret: &str) -> Agent {
    let log = Arc::new(Mutex::new(Vec::new()));
    let notes = Arc::clone(&log);
    let server = CommandServer::start(
        "127.0.0.2".parse::<IpAddr>().unwrap(),
        JobSecret::new(secret.as_bytes()).unwrap(),
        Arc::new(move |line: &str| notes.lock().unwrap().push(line.to_string())),
    )
    .expect("the command server listens on 127.0.0.2");
    Agent { server, log }
}

fn transport(agent: &Agent, secret: &str) -> Transport {
    Transport::Agent(AgentOptions {
        relay: PathBuf::from(env!("CARGO_BIN_EXE_pipette-run")),
        nodes: vec![AgentNode {
            host: HOST.to_string(),
            addr: agent.server.addr().to_string(),
        }],
        secret: JobSecret::new(secret.as_bytes()).unwrap(),
    })
}

const SECRET: &str = "test-secret-0123456789";

#[test]
fn commands_reach_the_agent_intact_and_come_back_as_given() {
    let agent = start_agent(SECRET);
    let t = transport(&agent, SECRET);
    let dir = tempfile::tempdir().unwrap();
    let log = || agent.log.lock().unwrap().join("\n");
    assert_remote_io_intact(&t, HOST, &dir.path().join("work dir 'x'"), &log);
    assert_remote_exit_code_and_streams(&t, HOST, &log);
}

#[test]
fn teardown_reaches_the_agents_node() {
    let agent = start_agent(SECRET);
    let t = transport(&agent, SECRET);
    let dir = tempfile::tempdir().unwrap();
    let log = || agent.log.lock().unwrap().join("\n");
    assert_teardown_reaches_the_node(&t, HOST, dir.path(), &log);
}

#[test]
fn a_relay_with_the_wrong_secret_runs_nothing() {
    let agent = start_agent(SECRET);
    let t = transport(&agent, "not-the-job-secret-0000");
    let dir = tempfile::tempdir().unwrap();
    let witness = dir.path().join("ran");
    let command = NodeCommand::new("touch").arg(witness.to_str().unwrap());
    let err = run(&t, HOST, &command, Duration::from_secs(30)).unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "agent to {HOST} failed: cannot reach the agent of {HOST} at 127.0.0.2:"
        )) && text.contains(": refused: wrong job secret ("),
        "{text}"
    );
    assert!(!witness.exists(), "the command ran");
    let notes = agent.log.lock().unwrap().clone();
    assert!(
        notes.iter().any(
            |n| n.starts_with("refused a command connection from 127.0.0.1:")
                && n.ends_with(": wrong job secret (nothing was run)")
        ),
        "{notes:?}"
    );
}

#[test]
fn a_node_without_an_agent_is_unreachable() {
    let agent = start_agent(SECRET);
    let t = transport(&agent, SECRET);
    let err = run(
        &t,
        "node-z",
        &NodeCommand::new("true"),
        Duration::from_secs(5),
    )
    .unwrap_err();
    assert!(matches!(err, ExecError::BadHost { .. }), "{err}");
    // A server that is gone: the relay cannot connect.
    drop(agent);
    let err = run(&t, HOST, &NodeCommand::new("true"), Duration::from_secs(30)).unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(err.to_string().contains("Connection refused"), "{err}");
}
