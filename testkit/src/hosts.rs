//! Test hosts (issue 36): network namespaces of this machine, each with a link of its own (a
//! veth pair) to the machine's namespace, where PostgreSQL and RabbitMQ run. A worker started on
//! one ([`crate::SystemBuilder::worker_on`]) has its own network stack and addresses, and the
//! test can cut the host off from the broker, from the database or from both, then heal it.
//!
//! Each host has a /29 of 10.231.0.0/16:
//! - `.1` the database's gateway and `.2` the broker's, on the machine's end of the link;
//! - `.3` the host's address toward the database and `.4` toward the broker, on its `eth0`.
//!
//! The machine's PostgreSQL and RabbitMQ listen on loopback only (and the broker's `guest` may
//! log in only from there), so a forwarder of the test's listens on each gateway address and
//! passes the connections on to them: each connection's path between the host and its gateway
//! is the host's own. A cut is a blackhole route on each side of the link for one flow: its
//! packets are dropped both ways without a word, so established connections stall (a partition,
//! not a reset) and a new connection fails at once, as behind a router that lost its route (this
//! machine's kernel has no packet filter to drop a new connection's packets without a word, so
//! connect timeouts are not what a cut exercises). Needs root and iproute2's `ip`. Hosts a
//! killed test run left behind are removed by the next one (`sweep`).

use std::process::Command;

use crate::tcpcut::{TcpCut, with_authority};

/// What a cut separates the host from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    Broker,
    Database,
    /// Both: the host is cut off entirely.
    Everything,
}

/// One test host; removed (namespace, link, forwarders) when dropped.
pub struct TestHost {
    /// The network namespace's name (also the machine's end of the link).
    pub name: String,
    database: TcpCut,
    broker: TcpCut,
    link: Link,
}

impl TestHost {
    /// Makes a namespace and its link, with forwarders to the database of
    /// [`crate::admin_database_url`] and the broker of [`crate::amqp_url`].
    pub async fn create() -> TestHost {
        let root = Command::new("id").arg("-u").output().is_ok_and(|out| out.stdout.starts_with(b"0\n"));
        assert!(root, "test hosts are network namespaces: run as root");
        sweep();
        // (the creating process's id in the name, for `sweep`; 15 characters, an interface's most)
        let name = format!("at{:05x}{:08x}", std::process::id() & 0xf_ffff, rand::random::<u32>());
        ip(&["netns", "add", &name]);
        // (one subnet chosen and taken at a time: tests in parallel would otherwise pick the same)
        static CHOOSING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let choosing = CHOOSING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let link = Link { name: name.clone(), base: free_subnet() };
        ip(&["link", "add", &name, "type", "veth", "peer", "name", "eth0", "netns", &name]);
        for last in [1, 2] {
            ip(&["addr", "add", &format!("{}/29", link.at(last)), "dev", &name]);
        }
        drop(choosing);
        ip(&["link", "set", &name, "up"]);
        for last in [3, 4] {
            link.inside(&["addr", "add", &format!("{}/29", link.at(last)), "dev", "eth0"]);
        }
        link.inside(&["link", "set", "eth0", "up"]);
        link.inside(&["link", "set", "lo", "up"]);
        // each flow leaves from its own address, so that the machine's side can cut one alone
        link.inside(&["route", "add", &format!("{}/32", link.at(1)), "dev", "eth0", "src", &link.at(3)]);
        link.inside(&["route", "add", &format!("{}/32", link.at(2)), "dev", "eth0", "src", &link.at(4)]);
        let database = authority(&crate::admin_database_url(), 5432);
        let broker = authority(&crate::amqp_url(), 5672);
        TestHost {
            name,
            database: TcpCut::start_on(&format!("{}:0", link.at(1)), &database).await,
            broker: TcpCut::start_on(&format!("{}:0", link.at(2)), &broker).await,
            link,
        }
    }

    /// `url` (a `DATABASE_URL`) as reached from this host.
    pub fn database_url(&self, url: &str) -> String {
        with_authority(url, &self.database.addr.to_string())
    }

    /// `url` (an `AMQP_URL`) as reached from this host.
    pub fn amqp_url(&self, url: &str) -> String {
        with_authority(url, &self.broker.addr.to_string())
    }

    /// Where a process started on this host runs and reaches the services.
    pub(crate) fn placement(&self) -> Placement {
        Placement {
            netns: self.name.clone(),
            database: self.database.addr.to_string(),
            broker: self.broker.addr.to_string(),
        }
    }

    /// From now on nothing of `what` passes between this host and the machine, either way.
    pub fn cut(&self, what: Cut) {
        for (gateway, own) in self.link.flows(what) {
            self.link.inside(&["route", "replace", "blackhole", &format!("{gateway}/32")]);
            ip(&["route", "replace", "blackhole", &format!("{own}/32")]);
        }
    }

    /// Ends the cut of `what` (what the partition held passes on, as TCP retransmits it).
    pub fn heal(&self, what: Cut) {
        for (gateway, own) in self.link.flows(what) {
            self.link.inside(&["route", "replace", &format!("{gateway}/32"), "dev", "eth0", "src", &own]);
            // (a flow that was not cut has no blackhole to remove)
            let _ = Command::new("ip").args(["route", "del", "blackhole", &format!("{own}/32")]).output();
        }
    }
}

/// A process's host: its namespace, and the gateways (`address:port`) it reaches PostgreSQL and
/// RabbitMQ through.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    pub netns: String,
    pub database: String,
    pub broker: String,
}

/// A host's namespace and link, with its /29 (`base` is its first address, less one).
struct Link {
    name: String,
    base: [u8; 4],
}

impl Link {
    fn at(&self, last: u8) -> String {
        let [a, b, c, d] = self.base;
        format!("{a}.{b}.{c}.{}", d + last)
    }

    /// (gateway, the host's own address) of each flow `what` names.
    fn flows(&self, what: Cut) -> Vec<(String, String)> {
        match what {
            Cut::Database => vec![(self.at(1), self.at(3))],
            Cut::Broker => vec![(self.at(2), self.at(4))],
            Cut::Everything => vec![(self.at(1), self.at(3)), (self.at(2), self.at(4))],
        }
    }

    /// `ip <args>` inside the namespace.
    fn inside(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // (a blackhole on the machine's side outlives the namespace: removed first)
        for (_, own) in self.flows(Cut::Everything) {
            let _ = Command::new("ip").args(["route", "del", "blackhole", &format!("{own}/32")]).output();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Removes what test hosts of processes that are gone left behind (a test run killed before its
/// hosts were dropped): their namespaces (and links), then the blackholes toward 10.231.0.0/16
/// that no link's subnet holds any more.
fn sweep() {
    let listed = Command::new("ip").args(["netns", "list"]).output().map(|out| out.stdout).unwrap_or_default();
    for name in String::from_utf8_lossy(&listed).lines().filter_map(|line| line.split_whitespace().next()) {
        let Some(pid) = name.strip_prefix("at").filter(|rest| rest.len() == 13).and_then(|rest| rest.get(..5)) else {
            continue;
        };
        let Ok(pid) = u32::from_str_radix(pid, 16) else { continue };
        // (a pid is kept to 20 bits in the name: a live process whose id differs above them is
        // taken for the owner, and its hosts are left alone)
        let alive = std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|entry| {
            entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()).is_some_and(|p| p & 0xf_ffff == pid)
        });
        if !alive {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
    let routes = Command::new("ip").args(["-o", "route", "show", "type", "blackhole"]).output();
    let addrs = Command::new("ip").args(["-o", "-4", "addr"]).output();
    let (Ok(routes), Ok(addrs)) = (routes, addrs) else { return };
    let addrs = String::from_utf8_lossy(&addrs.stdout).into_owned();
    for line in String::from_utf8_lossy(&routes.stdout).lines() {
        let Some(own) = line.split_whitespace().nth(1).and_then(|dest| dest.strip_suffix("/32")) else { continue };
        let Some(rest) = own.strip_prefix("10.231.") else { continue };
        let Some((third, last)) = rest.split_once('.') else { continue };
        let Ok(last) = last.parse::<u8>() else { continue };
        // the gateways of its /29 (.1 and .2 past the base) are on a live link, or it is stale
        let gateway = format!(" 10.231.{third}.{}/29", last / 8 * 8 + 1);
        if !addrs.contains(&gateway) {
            let _ = Command::new("ip").args(["route", "del", "blackhole", &format!("{own}/32")]).output();
        }
    }
}

/// `ip <args>`; panics with what it said if it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A /29 of 10.231.0.0/16 no address of this machine is in.
fn free_subnet() -> [u8; 4] {
    let taken = String::from_utf8(Command::new("ip").args(["-o", "-4", "addr"]).output().unwrap().stdout).unwrap();
    loop {
        let block: u16 = rand::random::<u16>() % 8192;
        let base = [10, 231, (block / 32) as u8, (block % 32 * 8) as u8];
        let prefix = format!(" {}.{}.{}.", base[0], base[1], base[2]);
        let used = taken.lines().filter_map(|line| line.split_once(&prefix).map(|(_, rest)| rest)).any(|rest| {
            let last: u8 = rest.split('/').next().and_then(|n| n.parse().ok()).unwrap_or(0);
            last / 8 == base[3] / 8
        });
        if !used {
            return base;
        }
    }
}

/// `host:port` of `url` (`default_port` when it names none).
fn authority(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if host.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok()) {
        host.to_string()
    } else {
        format!("{host}:{default_port}")
    }
}
