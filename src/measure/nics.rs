//! How many NICs a node's collectives spread over: the RDMA devices of
//! `/sys/class/infiniband` (one entry per port), narrowed as NCCL narrows them.
//!
//! NCCL opens every active RDMA port unless `NCCL_IB_HCA` names some, and gives each GPU
//! the port nearest to it; so a collective that crosses nodes runs over at most one port
//! per GPU, and on a DGX H100 the storage ports (the two dual-port cards on the CPU side)
//! carry none of it. The node's count is therefore the active ports `NCCL_IB_HCA` admits
//! (when set) or else the active ports of the fastest kind (InfiniBand before Ethernet,
//! then the highest rate), at most one per GPU.
//!
//! [`LISTING_SCRIPT`] lists the ports on a node; [`parse_ports`] reads what it printed
//! (pure, tested on trees that reproduce real DGX H100 and GB200 layouts,
//! `tests/fixtures/sysfs/`).

use super::inventory::ParseError;

/// A shell script that prints one `PATH:VALUE` line per port attribute (`state`, `rate`,
/// `link_layer`) under `$1/class/infiniband` (`$1` is `/sys` on a node, a fixture tree in
/// tests); nothing when the node has no RDMA devices.
pub const LISTING_SCRIPT: &str = r#"root="${1:-/sys}"
for p in "$root"/class/infiniband/*/ports/*; do
  [ -d "$p" ] || continue
  for a in state rate link_layer; do
    [ -r "$p/$a" ] && printf '%s:%s\n' "$p/$a" "$(cat "$p/$a")"
  done
done
exit 0
"#;

/// The link layer of an RDMA port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkLayer {
    InfiniBand,
    /// RoCE.
    Ethernet,
}

/// One RDMA port as sysfs describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RdmaPort {
    /// The device (`mlx5_0`), as `NCCL_IB_HCA` names it.
    pub device: String,
    pub port: u32,
    /// `state` reads `4: ACTIVE`.
    pub active: bool,
    /// `rate`'s figure (`400 Gb/sec (4X NDR)` → 400); 0 when it was not listed.
    pub gbit_per_s: f64,
    pub link_layer: Option<LinkLayer>,
}

/// Reads [`LISTING_SCRIPT`]'s output: lines `…/class/infiniband/DEV/ports/N/ATTR:VALUE`.
/// Ports come back sorted by device and port; a port without a `state` line counts as
/// not active.
pub fn parse_ports(text: &str) -> Result<Vec<RdmaPort>, ParseError> {
    let mut ports: Vec<RdmaPort> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        let bad = |what: &str| ParseError {
            what: format!("line {}: {what}: {line:?}", n + 1),
        };
        let (path, value) = line.split_once(':').ok_or_else(|| bad("no ':'"))?;
        let parts: Vec<&str> = path.rsplit('/').take(4).collect();
        let [attr, port, ports_dir, device] = parts[..] else {
            return Err(bad("not a port attribute path"));
        };
        let port: u32 = port
            .parse()
            .ok()
            .filter(|_| ports_dir == "ports")
            .ok_or_else(|| bad("not a port attribute path"))?;
        let at = match ports
            .iter()
            .position(|p| p.device == device && p.port == port)
        {
            Some(at) => at,
            None => {
                ports.push(RdmaPort {
                    device: device.to_owned(),
                    port,
                    active: false,
                    gbit_per_s: 0.0,
                    link_layer: None,
                });
                ports.len() - 1
            }
        };
        let entry = &mut ports[at];
        let value = value.trim();
        match attr {
            "state" => entry.active = value.ends_with("ACTIVE"),
            "rate" => {
                entry.gbit_per_s = value
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse().ok())
                    .ok_or_else(|| bad("no rate (expected e.g. `400 Gb/sec (4X NDR)`)"))?
            }
            "link_layer" => {
                entry.link_layer = match value {
                    "InfiniBand" => Some(LinkLayer::InfiniBand),
                    "Ethernet" => Some(LinkLayer::Ethernet),
                    _ => None,
                }
            }
            _ => {}
        }
    }
    ports.sort_by(|a, b| (&a.device, a.port).cmp(&(&b.device, b.port)));
    Ok(ports)
}

/// Whether `NCCL_IB_HCA`'s value admits `port` (NCCL's syntax: a comma-separated list of
/// `device[:port]`, each a prefix unless the list starts with `=`; a leading `^` excludes
/// the listed ones instead).
pub fn hca_admits(filter: &str, port: &RdmaPort) -> bool {
    let filter = filter.trim();
    let (exclude, rest) = match filter.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, filter),
    };
    let (exact, rest) = match rest.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let listed = rest
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| {
            let (device, wanted_port) = match entry.split_once(':') {
                Some((d, p)) => (d, p.parse::<u32>().ok()),
                None => (entry, None),
            };
            let device_matches = if exact {
                port.device == device
            } else {
                port.device.starts_with(device)
            };
            device_matches && wanted_port.is_none_or(|p| p == port.port)
        });
    listed != exclude
}

/// The NICs a node's collectives spread over (see the module doc): `None` when the node
/// has no active RDMA port (NCCL falls back to sockets: one NIC's worth, today's meaning).
pub fn nccl_nics(ports: &[RdmaPort], nccl_ib_hca: Option<&str>, gpus: usize) -> Option<u32> {
    let active: Vec<&RdmaPort> = ports
        .iter()
        .filter(|p| p.active)
        .filter(|p| nccl_ib_hca.is_none_or(|f| hca_admits(f, p)))
        .collect();
    let chosen = if nccl_ib_hca.is_some() {
        active.len()
    } else {
        // The fastest kind: InfiniBand before RoCE, then the highest rate.
        let best = active
            .iter()
            .map(|p| (p.link_layer.unwrap_or(LinkLayer::Ethernet), -p.gbit_per_s))
            .min_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        match best {
            Some((layer, rate)) => active
                .iter()
                .filter(|p| p.link_layer.unwrap_or(LinkLayer::Ethernet) == layer)
                .filter(|p| p.gbit_per_s == -rate)
                .count(),
            None => 0,
        }
    };
    let nics = chosen.min(gpus.max(1));
    (nics > 0).then_some(nics as u32)
}

/// The NICs per node of a cluster: the fewest any node has (a collective across nodes is
/// as fast as its slowest end), `None` when a node has no RDMA port or none was listed.
pub fn cluster_nics(per_node: &[Option<u32>]) -> Option<u32> {
    per_node
        .iter()
        .copied()
        .collect::<Option<Vec<u32>>>()?
        .into_iter()
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, n: u32, layer: LinkLayer, rate: f64) -> RdmaPort {
        RdmaPort {
            device: device.into(),
            port: n,
            active: true,
            gbit_per_s: rate,
            link_layer: Some(layer),
        }
    }

    #[test]
    fn lines_give_ports() {
        let text = "/sys/class/infiniband/mlx5_1/ports/1/state:4: ACTIVE\n\
                    /sys/class/infiniband/mlx5_1/ports/1/rate:400 Gb/sec (4X NDR)\n\
                    /sys/class/infiniband/mlx5_1/ports/1/link_layer:InfiniBand\n\
                    /sys/class/infiniband/mlx5_0/ports/1/state:1: DOWN\n";
        let ports = parse_ports(text).unwrap();
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].device, "mlx5_0");
        assert!(!ports[0].active);
        assert_eq!(ports[1].gbit_per_s, 400.0);
        assert_eq!(ports[1].link_layer, Some(LinkLayer::InfiniBand));
        let err = parse_ports("/sys/x/rate:400\n").unwrap_err();
        assert!(err.to_string().starts_with("line 1: not a port"), "{err}");
        let err = parse_ports("/a/mlx5_0/ports/1/rate:fast\n").unwrap_err();
        assert!(err.to_string().contains("no rate"), "{err}");
    }

    #[test]
    fn nccl_ib_hca_syntax() {
        let p = port("mlx5_10", 1, LinkLayer::InfiniBand, 400.0);
        assert!(hca_admits("mlx5_1", &p), "a prefix");
        assert!(!hca_admits("=mlx5_1", &p), "exact");
        assert!(hca_admits("=mlx5_10:1", &p));
        assert!(!hca_admits("mlx5_10:2", &p));
        assert!(!hca_admits("^mlx5_1", &p));
        assert!(hca_admits("^=mlx5_1", &p));
    }

    #[test]
    fn fastest_kind_and_one_per_gpu() {
        let mut ports: Vec<RdmaPort> = (0..4)
            .map(|i| port(&format!("mlx5_{i}"), 1, LinkLayer::InfiniBand, 400.0))
            .collect();
        ports.push(port("mlx5_4", 1, LinkLayer::InfiniBand, 200.0));
        ports.push(port("mlx5_5", 1, LinkLayer::Ethernet, 400.0));
        assert_eq!(nccl_nics(&ports, None, 8), Some(4));
        assert_eq!(nccl_nics(&ports, None, 2), Some(2));
        assert_eq!(nccl_nics(&ports, Some("mlx5_4,mlx5_5"), 8), Some(2));
        assert_eq!(nccl_nics(&ports, Some("mlx5_9"), 8), None);
        assert_eq!(nccl_nics(&[], None, 8), None);
        assert_eq!(cluster_nics(&[Some(8), Some(4)]), Some(4));
        assert_eq!(cluster_nics(&[Some(8), None]), None);
        assert_eq!(cluster_nics(&[]), None);
    }
}
