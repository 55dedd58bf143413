//! Many clients against a simulated server that, like dnsmasq, does not
//! reserve an address at OFFER time: concurrent clients are offered the same
//! address and all but one get a DHCPNAK at REQUEST. Every client must still end
//! BOUND, with distinct addresses, inside the default 30 s deadline.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use dhcproto::v4::MessageType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::server::{Request, SERVER_IP, Server, WALL0};
use crate::{Client, ClientConfig, Event, State, Transmit};

/// A message in flight: delivered at `at` to the server (`to == None`) or to
/// client `to`.
struct Flight {
    at: Duration,
    seq: u64,
    to: Option<usize>,
    tx: Transmit,
    payload: Vec<u8>,
}

impl PartialEq for Flight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Flight {}
impl PartialOrd for Flight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Flight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Sim {
    t0: Instant,
    now: Duration,
    rng: StdRng,
    clients: Vec<Client>,
    flights: BinaryHeap<Reverse<Flight>>,
    seq: u64,
    /// address → chaddr of the client holding it.
    bound: BTreeMap<Ipv4Addr, [u8; 6]>,
    srv: Server,
    naks: u64,
}

fn mac(i: usize) -> [u8; 6] {
    [0x02, 0, 0, 0, (i >> 8) as u8, i as u8]
}

impl Sim {
    fn latency(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(200..20_000))
    }

    fn send(&mut self, to: Option<usize>, tx: Transmit, payload: Vec<u8>, extra: Duration) {
        let at = self.now + extra + self.latency();
        self.seq += 1;
        self.flights.push(Reverse(Flight {
            at,
            seq: self.seq,
            to,
            tx,
            payload,
        }));
    }

    fn drain_client(&mut self, i: usize) {
        while let Some(t) = self.clients[i].poll_transmit() {
            self.send(None, t, Vec::new(), Duration::ZERO);
        }
    }

    /// Server logic: lowest free address at DISCOVER (no reservation); NAK a
    /// REQUEST whose address another client got meanwhile.
    fn serve(&mut self, req: &Transmit) {
        let i = usize::from(req.payload[33]) | (usize::from(req.payload[32]) << 8);
        let r = Request::decode(req);
        let chaddr = mac(i);
        let free = (10..250u8)
            .map(|h| Ipv4Addr::new(192, 0, 2, h))
            .find(|a| self.bound.get(a).is_none_or(|c| *c == chaddr))
            .expect("pool exhausted");
        let (ty, addr) = match r.msg_type() {
            MessageType::Discover => {
                let mine = self
                    .bound
                    .iter()
                    .find(|(_, c)| **c == chaddr)
                    .map(|(a, _)| *a);
                (MessageType::Offer, mine.unwrap_or(free))
            }
            MessageType::Request => {
                if r.server_id().is_some_and(|s| s != SERVER_IP) {
                    return;
                }
                let want = r.requested_ip().unwrap_or(r.msg.ciaddr());
                match self.bound.get(&want) {
                    Some(c) if *c != chaddr => (MessageType::Nak, Ipv4Addr::UNSPECIFIED),
                    _ => {
                        self.bound.retain(|_, c| *c != chaddr);
                        self.bound.insert(want, chaddr);
                        (MessageType::Ack, want)
                    }
                }
            }
            _ => return,
        };
        if ty == MessageType::Nak {
            self.naks += 1;
        }
        let reply = self.srv.reply(req, ty, addr);
        // dnsmasq-like processing time.
        let think = Duration::from_micros(self.rng.random_range(0..5_000));
        self.send(Some(i), req.clone(), reply, think);
    }

    fn run_until(&mut self, end: Duration) {
        loop {
            let next_flight = self.flights.peek().map(|f| f.0.at);
            let next_timer = self
                .clients
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.poll_timeout().map(|t| (t - self.t0, i)))
                .min();
            let step = match (next_flight, next_timer) {
                (None, None) => break,
                (Some(f), Some((t, _))) if f <= t => Err(f),
                (Some(f), None) => Err(f),
                (_, Some((t, i))) => Ok((t, i)),
            };
            match step {
                Err(at) => {
                    if at > end {
                        break;
                    }
                    self.now = at;
                    let Reverse(f) = self.flights.pop().unwrap();
                    match f.to {
                        None => self.serve(&f.tx),
                        Some(i) => {
                            let now = self.t0 + self.now;
                            self.clients[i]
                                .set_wall_clock_unix_ms(WALL0 + self.now.as_millis() as u64);
                            let _ = self.clients[i].handle_packet(now, self.srv.src(), &f.payload);
                            self.drain_client(i);
                        }
                    }
                }
                Ok((t, i)) => {
                    if t > end {
                        break;
                    }
                    self.now = t;
                    let now = self.t0 + t;
                    self.clients[i].handle_timeout(now);
                    self.drain_client(i);
                }
            }
        }
    }
}

#[test]
fn concurrent_clients_against_a_nak_happy_server_all_bind() {
    for seed in 0..5u64 {
        let t0 = Instant::now();
        let n = 50;
        let mut rng = StdRng::seed_from_u64(seed);
        let clients: Vec<Client> = (0..n)
            .map(|i| {
                // Starts spread over 200 ms, like a burst of pod creations.
                let start = t0 + Duration::from_micros(rng.random_range(0..200_000));
                let cfg = ClientConfig {
                    chaddr: mac(i),
                    ..ClientConfig::default()
                };
                Client::new(cfg, start, seed * 1000 + i as u64)
            })
            .collect();
        let mut sim = Sim {
            t0,
            now: Duration::ZERO,
            rng,
            clients,
            flights: BinaryHeap::new(),
            seq: 0,
            bound: BTreeMap::new(),
            srv: Server::default(),
            naks: 0,
        };
        for i in 0..n {
            sim.drain_client(i);
        }
        sim.run_until(Duration::from_secs(30));
        let mut addrs = Vec::new();
        for (i, c) in sim.clients.iter_mut().enumerate() {
            assert_eq!(
                c.state(),
                State::Bound,
                "seed {seed} client {i}: {:?}",
                c.stats()
            );
            let events: Vec<Event> = std::iter::from_fn(|| c.poll_event()).collect();
            assert!(
                events.iter().any(|e| matches!(e, Event::Bound(_))),
                "{events:?}"
            );
            addrs.push(c.lease().unwrap().address);
        }
        addrs.sort_unstable();
        addrs.dedup();
        assert_eq!(addrs.len(), n, "addresses must be distinct");
        // The scenario really exercised the NAK path.
        assert!(sim.naks >= 10, "seed {seed}: only {} NAKs", sim.naks);
        let total_naks: u64 = sim.clients.iter().map(|c| c.stats().naks_received).sum();
        assert_eq!(total_naks, sim.naks);
    }
}
