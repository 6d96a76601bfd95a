//! Is a node fit to run the next attempt? It must answer through the transport within a
//! short time, and when its profile lists real GPUs, `nvidia-smi -L` must show at least
//! that many. (CPU stand-ins, GPUs named `cpu` in a profile made without GPUs, need no
//! check beyond reaching the node.)

use std::time::Duration;

use serde::Serialize;

use crate::cluster::ClusterProfile;
use crate::exec::{self, NodeCommand, Transport};

/// One node's health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    pub host: String,
    pub healthy: bool,
    /// What was checked, or what failed.
    pub detail: String,
}

/// How many real GPUs `host` should show, from the profile (`None`: no GPU check).
pub fn expected_gpus(profile: &ClusterProfile, host: &str) -> Option<usize> {
    let node = profile
        .nodes
        .iter()
        .find(|n| crate::exec::same_host(&n.host, host))?;
    let gpus = node.gpus()?;
    (!gpus.is_empty() && gpus.iter().all(|g| g.name != "cpu")).then_some(gpus.len())
}

/// Checks `host` through `transport` within `timeout`.
pub fn check(transport: &Transport, host: &str, gpus: Option<usize>, timeout: Duration) -> Health {
    let health = |healthy: bool, detail: String| Health {
        host: host.to_string(),
        healthy,
        detail,
    };
    let command = match gpus {
        Some(_) => NodeCommand::new("nvidia-smi").arg("-L"),
        None => NodeCommand::new("true"),
    };
    match exec::run(transport, host, &command, timeout) {
        Err(e) => health(false, e.to_string()),
        Ok(out) if !out.status.success() => health(
            false,
            format!(
                "{} failed with {}{}",
                command.label(),
                out.status,
                out.last_line()
                    .map(|l| format!(": {l}"))
                    .unwrap_or_default()
            ),
        ),
        Ok(out) => match gpus {
            None => health(
                true,
                format!("reached through {}", transport.kind().as_str()),
            ),
            Some(want) => {
                let seen = count_gpus(&out.stdout_text());
                if seen >= want {
                    health(true, format!("{seen} GPUs visible"))
                } else {
                    health(
                        false,
                        format!("nvidia-smi shows {seen} GPUs, the profile {want}"),
                    )
                }
            }
        },
    }
}

/// The GPUs `nvidia-smi -L` lists (`GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)`; the
/// indented MIG devices under a GPU are not counted again).
pub fn count_gpus(listing: &str) -> usize {
    listing.lines().filter(|l| l.starts_with("GPU ")).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_are_counted_from_nvidia_smi_l() {
        let listing = "\
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-6f1a2b3c-0d4e-5f60-7182-93a4b5c6d7e8)
  MIG 3g.40gb     Device  0: (UUID: MIG-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901)
  MIG 3g.40gb     Device  1: (UUID: MIG-2c3d4e5f-6071-8293-a4b5-c6d7e8f90112)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-7a2b3c4d-1e5f-6071-8293-a4b5c6d7e8f9)
";
        assert_eq!(count_gpus(listing), 2);
        assert_eq!(count_gpus("No devices were found\n"), 0);
    }

    #[test]
    fn an_unreachable_node_is_not_healthy() {
        // A port nothing listens on: ssh is refused at once.
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let transport = Transport::Ssh(crate::exec::SshOptions {
            port: Some(port),
            extra_args: vec!["-F".into(), "/dev/null".into()],
            ..crate::exec::SshOptions::default()
        });
        let h = check(&transport, "127.0.0.1", None, Duration::from_secs(10));
        assert!(!h.healthy, "{h:?}");
        assert!(h.detail.contains("ssh to 127.0.0.1 failed"), "{h:?}");
    }

    #[test]
    fn a_local_node_is_healthy() {
        let h = check(&Transport::Local, "node-a", None, Duration::from_secs(10));
        assert!(h.healthy, "{h:?}");
        assert_eq!(h.detail, "reached through local");
    }
}
