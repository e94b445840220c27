//! A real multi-node `nats-server` cluster with JetStream on every node, owned by a
//! [`NatsCluster`] value.
//!
//! Invariants:
//! - **Ports chosen by the servers.** A JetStream cluster refuses to start without its
//!   routes, and the routes name every node's cluster port, so the ports must be known
//!   before the real launch. Each node is first launched without JetStream on `-1`
//!   ports (client, cluster, monitoring): the server picks them and writes them to its
//!   ports file. Those launches are killed and every node is launched again on exactly
//!   those ports, with JetStream and routes to all nodes. If another process took a
//!   port in between (the start fails with "address already in use"), the whole
//!   procedure is retried, a bounded number of times.
//! - **Same ports for life.** A node keeps its client, cluster and monitoring ports
//!   across [`NatsServer::kill`] + [`NatsServer::restart`] (its config
//!   file is fixed), and its JetStream store, so a restarted node rejoins as the same
//!   peer.
//! - **Ready means a meta leader.** [`start`](NatsCluster::start) returns once every
//!   node answers on its client port, all of them agree on one JetStream meta leader
//!   and every node's `/healthz` answers 200 (bounded by the startup timeout).
//! - Leaders are read from each node's HTTP monitoring endpoint (`/jsz`), which works
//!   without a system account, and which node a client is connected to from `/connz`
//!   (by the connection name the client sent). A killed or paused node is skipped.
//! - Dropping the value kills and reaps every node (each is a [`NatsServer`]).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind};
use crate::server::{NatsServer, NatsServerOptions, parse_ports_entry};

/// The cluster name every node is configured with.
pub const CLUSTER_NAME: &str = "weir";

/// How often the whole port-discovery + launch procedure is tried.
const LAUNCH_ATTEMPTS: usize = 3;

/// Bound of one HTTP request to a node's monitoring port.
const HTTP_TIMEOUT: Duration = Duration::from_millis(500);

/// Poll interval of the leader waits.
const POLL: Duration = Duration::from_millis(50);

/// Calls `probe` every [`POLL`] until it answers `Ok`, for at most `timeout`; then
/// its last `Err` (what is not so yet) is the [`ErrorKind::StartTimeout`] message.
fn poll<T>(timeout: Duration, mut probe: impl FnMut() -> Result<T, String>) -> Result<T, Error> {
    let deadline = Instant::now() + timeout;
    loop {
        match probe() {
            Ok(v) => return Ok(v),
            Err(why) if Instant::now() >= deadline => {
                return Err(Error::new(ErrorKind::StartTimeout, why));
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// The fixed ports of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePorts {
    /// Client port (`nats://127.0.0.1:PORT`).
    pub client: u16,
    /// Cluster (route) port.
    pub cluster: u16,
    /// HTTP monitoring port.
    pub monitoring: u16,
}

/// A running cluster of `nats-server` nodes on loopback; see the [module docs](self).
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<NatsServer>,
    names: Vec<String>,
    ports: Vec<NodePorts>,
}

impl NatsCluster {
    /// Starts `size` nodes (at least 1) with JetStream, routed to each other, and waits
    /// for a meta leader.
    pub fn start(size: usize) -> Result<Self, Error> {
        Self::start_with(size, NatsServerOptions::default())
    }

    /// Like [`start`](Self::start), with `base` options for every node: `binary`,
    /// `auth`, `startup_timeout` and `extra_args` are used; `config` is prepended to
    /// each node's generated config; `jetstream` is always on.
    pub fn start_with(size: usize, base: NatsServerOptions) -> Result<Self, Error> {
        if size == 0 {
            return Err(Error::new(
                ErrorKind::Spawn,
                "a cluster needs at least one node",
            ));
        }
        let mut last = None;
        for _ in 0..LAUNCH_ATTEMPTS {
            match Self::try_start(size, &base) {
                Ok(cluster) => return Ok(cluster),
                Err(e)
                    if e.kind() == ErrorKind::Exited
                        && e.to_string().contains("address already in use") =>
                {
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::new(ErrorKind::Spawn, "cluster did not start")))
    }

    fn try_start(size: usize, base: &NatsServerOptions) -> Result<Self, Error> {
        let names: Vec<String> = (0..size).map(|i| format!("n{i}")).collect();
        // Phase 1: let each server pick its ports (no JetStream: it would refuse to
        // start without routes).
        let mut ports = Vec::with_capacity(size);
        for name in &names {
            let probe = NatsServer::start_with(NatsServerOptions {
                jetstream: false,
                config: Some(format!(
                    "server_name: {name}\ncluster {{ name: {CLUSTER_NAME}, listen: \"127.0.0.1:-1\" }}\nhttp: \"127.0.0.1:-1\"\n"
                )),
                ..base.clone()
            })?;
            let text = probe.ports_file_text().unwrap_or_default();
            let (Some(cluster), Some(monitoring)) = (
                parse_ports_entry(&text, "cluster"),
                parse_ports_entry(&text, "monitoring"),
            ) else {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("node {name}: no cluster/monitoring port in its ports file: {text:?}"),
                ));
            };
            ports.push(NodePorts {
                client: probe.port(),
                cluster,
                monitoring,
            });
            // Dropping kills and reaps it: the ports are free again.
        }
        // Phase 2: the real nodes, on those ports.
        let routes = ports
            .iter()
            .map(|p| format!("\"nats-route://127.0.0.1:{}\"", p.cluster))
            .collect::<Vec<_>>()
            .join(", ");
        let mut nodes = Vec::with_capacity(size);
        for (name, p) in names.iter().zip(&ports) {
            let mut config = base.config.clone().unwrap_or_default();
            config.push_str(&format!(
                "\nserver_name: {name}\nhttp: \"127.0.0.1:{}\"\ncluster {{\n  name: {CLUSTER_NAME}\n  listen: \"127.0.0.1:{}\"\n  routes: [{routes}]\n}}\n",
                p.monitoring, p.cluster
            ));
            let mut extra_args = vec!["-p".to_owned(), p.client.to_string()];
            extra_args.extend(base.extra_args.iter().cloned());
            nodes.push(NatsServer::start_with(NatsServerOptions {
                jetstream: true,
                config: Some(config),
                extra_args,
                ..base.clone()
            })?);
        }
        let cluster = Self {
            nodes,
            names,
            ports,
        };
        cluster.wait_meta_leader(base.startup_timeout)?;
        cluster.wait_healthy(base.startup_timeout)?;
        Ok(cluster)
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i` as a [`NatsServer`] (url, pid, log, pause/resume/kill, and restart on its
    /// ports with its store: it rejoins as the same peer).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn node(&self, i: usize) -> &NatsServer {
        &self.nodes[i]
    }

    /// The `server_name` of node `i` (`n0`, `n1`, ...).
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The index of the node called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// The fixed ports of node `i`.
    pub fn ports(&self, i: usize) -> NodePorts {
        self.ports[i]
    }

    /// Every node's client URL (an async-nats client connects to a list of
    /// `ServerAddr`s parsed from them and reconnects to another node when one dies).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url().to_owned()).collect()
    }

    /// The JetStream meta leader's name, as the first reachable node reports it.
    pub fn meta_leader(&self) -> Option<String> {
        self.reachable().find_map(|i| self.meta_leader_of(i))
    }

    /// The meta leader node `i` names (`None`: unreachable, or no leader).
    fn meta_leader_of(&self, i: usize) -> Option<String> {
        let v = jsz(self.ports[i].monitoring, "").ok()?;
        v.pointer("/meta_cluster/leader")
            .and_then(|l| l.as_str())
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
    }

    /// Waits (bounded) until every reachable node names the same meta leader; returns
    /// its node index.
    pub fn wait_meta_leader(&self, timeout: Duration) -> Result<usize, Error> {
        poll(timeout, || {
            let views: Vec<Option<String>> =
                self.reachable().map(|i| self.meta_leader_of(i)).collect();
            if let Some(Some(first)) = views.first()
                && views.iter().all(|v| v.as_deref() == Some(first))
                && let Some(i) = self.index_of(first)
            {
                return Ok(i);
            }
            Err(format!(
                "no agreed JetStream meta leader within {timeout:?}: {views:?}"
            ))
        })
    }

    /// Waits (bounded) until every reachable node answers `GET /healthz` with 200 (on
    /// a JetStream node: its JetStream is current with the cluster).
    pub fn wait_healthy(&self, timeout: Duration) -> Result<(), Error> {
        poll(timeout, || {
            let sick: Vec<&str> = self
                .reachable()
                .filter(|&i| http_get(self.ports[i].monitoring, "/healthz").is_err())
                .map(|i| self.names[i].as_str())
                .collect();
            match sick.is_empty() {
                true => Ok(()),
                false => Err(format!("nodes {sick:?} not healthy within {timeout:?}")),
            }
        })
    }

    /// The node index leading stream `stream` (in the default account), as the first
    /// reachable node that knows the stream reports it.
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        self.reachable().find_map(|i| {
            let v = jsz(self.ports[i].monitoring, "?streams=true").ok()?;
            let leader = find_stream_leader(&v, stream)?;
            self.index_of(&leader)
        })
    }

    /// Waits (bounded) until stream `stream` has a leader; returns its node index.
    pub fn wait_stream_leader(&self, stream: &str, timeout: Duration) -> Result<usize, Error> {
        poll(timeout, || {
            self.stream_leader(stream)
                .ok_or_else(|| format!("stream {stream:?} has no leader within {timeout:?}"))
        })
    }

    /// The node a client named `name` (its `CONNECT` name, e.g. async-nats
    /// `ConnectOptions::name`) is connected to right now, as each reachable node's
    /// `/connz` reports it; `None` when no reachable node has such a client. With
    /// several clients of that name, the first node (by index) that has one.
    pub fn node_of_client(&self, name: &str) -> Option<usize> {
        self.reachable().find(|&i| {
            http_get(self.ports[i].monitoring, "/connz?limit=4096")
                .ok()
                .and_then(|body| serde_json::from_str::<serde_json::Value>(&body).ok())
                .is_some_and(|v| has_client(&v, name))
        })
    }

    /// Waits (bounded) until a client named `name` is connected to a reachable node
    /// other than `not` (pass `None` for any node); returns that node's index. A test
    /// uses it to see a service reconnect to a surviving node after a kill.
    pub fn wait_node_of_client(
        &self,
        name: &str,
        not: Option<usize>,
        timeout: Duration,
    ) -> Result<usize, Error> {
        poll(timeout, || {
            self.node_of_client(name)
                .filter(|&i| Some(i) != not)
                .ok_or_else(|| {
                    format!(
                        "no client named {name:?} on a node other than {not:?} within {timeout:?}"
                    )
                })
        })
    }

    /// Indices of nodes that run and are not paused.
    fn reachable(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_running() && !self.nodes[i].is_paused())
    }
}

/// The leader of `stream` in a `/jsz?streams=true` document.
fn find_stream_leader(v: &serde_json::Value, stream: &str) -> Option<String> {
    let accounts = v.get("account_details")?.as_array()?;
    accounts
        .iter()
        .filter_map(|a| a.get("stream_detail")?.as_array())
        .flatten()
        .find(|s| s.get("name").and_then(|n| n.as_str()) == Some(stream))
        .and_then(|s| s.pointer("/cluster/leader")?.as_str())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
}

/// Whether a `/connz` document lists a connection named `name`.
fn has_client(v: &serde_json::Value, name: &str) -> bool {
    v.get("connections")
        .and_then(|c| c.as_array())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.get("name").and_then(|n| n.as_str()) == Some(name))
        })
}

/// `GET /jsz<query>` on a monitoring port, parsed as JSON.
fn jsz(port: u16, query: &str) -> Result<serde_json::Value, Error> {
    let body = http_get(port, &format!("/jsz{query}"))?;
    serde_json::from_str(&body).map_err(|e| {
        Error::with_source(ErrorKind::Io, format!("bad /jsz answer on port {port}"), e)
    })
}

/// A minimal HTTP/1.0 GET (the monitoring endpoint closes the connection after it).
fn http_get(port: u16, path: &str) -> Result<String, Error> {
    let io = |e: std::io::Error| {
        Error::with_source(ErrorKind::Io, format!("GET {path} on port {port}"), e)
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(io)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(HTTP_TIMEOUT)).map_err(io)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(io)?;
    let mut text = String::new();
    stream
        .take(16 * 1024 * 1024)
        .read_to_string(&mut text)
        .map_err(io)?;
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(Error::new(
            ErrorKind::Io,
            format!("GET {path} on port {port}: no HTTP body"),
        ));
    };
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "GET {path} on port {port}: {}",
                head.lines().next().unwrap_or("")
            ),
        ));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_stream_leader_in_jsz() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"meta_cluster":{"leader":"n1"},"account_details":[{"name":"$G",
            "stream_detail":[{"name":"A","cluster":{"leader":"n0"}},
                             {"name":"KV_x","cluster":{"leader":"n2"}}]}]}"#,
        )
        .unwrap_or_default();
        assert_eq!(find_stream_leader(&v, "KV_x").as_deref(), Some("n2"));
        assert_eq!(find_stream_leader(&v, "A").as_deref(), Some("n0"));
        assert_eq!(find_stream_leader(&v, "B"), None);
    }

    #[test]
    fn finds_a_client_by_name_in_connz() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"num_connections":2,"connections":[{"cid":1,"name":"a"},{"cid":2}]}"#,
        )
        .unwrap_or_default();
        assert!(has_client(&v, "a"));
        assert!(!has_client(&v, "b"));
        assert!(!has_client(&serde_json::Value::Null, "a"));
    }
}
