//! Scripted servers for the client's tests: a coordinator whose tablet map follows a script,
//! masters that answer as their script says, an address where nothing listens, and servers
//! that die under requests (and may come back at the same address).

#![allow(dead_code)] // each test file uses its own part of the harness

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use stratus_client::TableId;
use stratus_env::Connection;
use stratus_rpc::{Handled, Service};
use stratus_types::{HashRange, ServerId, TabletState, Version};
use stratus_wire::{
    decode_request, encode_error_response, encode_response, EnumeratedObject, FrameHeader, Hello,
    IncrementItemResult, ReadItemResult, Request, Response, ServerStatistics, Status, TabletEntry,
    VersionItemResult, HELLO_BYTES, PROTOCOL_VERSION,
};

/// The table every scripted map describes.
pub const TABLE: TableId = TableId(1);

/// Which master owns the one tablet of [`TABLE`], and in which state, when the coordinator
/// serves its `n`-th map (counted from 0).
pub type MapScript = Box<dyn Fn(usize) -> (String, TabletState) + Send + Sync>;

/// A coordinator: its map of [`TABLE`] is one tablet, as the script says; table calls are
/// answered as if the table existed; counts the maps served (GET_TABLET_MAP and
/// AWAIT_TABLET_MAP alike, which it answers at once) and, apart, the awaited ones.
pub struct Coordinator {
    pub maps_served: AtomicUsize,
    pub maps_awaited: AtomicUsize,
    script: MapScript,
}

impl Coordinator {
    pub fn new(
        script: impl Fn(usize) -> (String, TabletState) + Send + Sync + 'static,
    ) -> Arc<Coordinator> {
        Arc::new(Coordinator {
            maps_served: AtomicUsize::new(0),
            maps_awaited: AtomicUsize::new(0),
            script: Box::new(script),
        })
    }

    /// A coordinator whose map names the master at `address`, always.
    pub fn serving(address: String) -> Arc<Coordinator> {
        Coordinator::moving(address, usize::MAX, String::new())
    }

    /// A coordinator whose map names `first` (normal) the first `times` maps, then `then`
    /// (normal): a master replaced once the client asked `times` times.
    pub fn moving(first: String, times: usize, then: String) -> Arc<Coordinator> {
        Coordinator::new(move |served| {
            let owner = if served < times { first.clone() } else { then.clone() };
            (owner, TabletState::Normal)
        })
    }
}

impl Service for Coordinator {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        let map = || {
            let served = self.maps_served.fetch_add(1, Ordering::SeqCst);
            let (owner_address, state) = (self.script)(served);
            let tablet = TabletEntry {
                table_id: TABLE,
                range: HashRange::FULL,
                owner: ServerId(1),
                owner_address,
                state,
            };
            vec![tablet]
        };
        let response = match decode_request(header.opcode_code, body) {
            Ok(Request::GetTabletMap { .. }) => Response::GetTabletMap { tablets: map() },
            Ok(Request::AwaitTabletMap { .. }) => {
                self.maps_awaited.fetch_add(1, Ordering::SeqCst);
                Response::AwaitTabletMap { tablets: map() }
            }
            Ok(Request::CreateTable { .. }) => Response::CreateTable { table_id: TABLE },
            Ok(Request::GetTableId { .. }) => Response::GetTableId { table_id: TABLE },
            Ok(Request::DropTable { .. }) => Response::DropTable,
            Ok(Request::ListTables) => Response::ListTables { tables: Vec::new() },
            Ok(Request::GetServerList) => Response::GetServerList { servers: Vec::new() },
            // Every client gets lease 1 (or keeps the one it renews).
            Ok(Request::ClientLease { lease }) => Response::ClientLease {
                lease: stratus_types::LeaseId(lease.0.max(1)),
                term_ms: 30_000,
            },
            _ => {
                let status = Status::UnimplementedRequest;
                encode_error_response(out, header.request_id, header.opcode_code, status, "");
                return Handled::Done;
            }
        };
        encode_response(out, header.request_id, Status::Ok, &response);
        Handled::Done
    }
}

/// How a scripted master answers a request: a status and response, or `None` to leave it
/// unanswered.
pub type Script = Box<dyn Fn(&Request) -> Option<(Status, Response)> + Send + Sync>;

/// A master that answers each request as its script says and counts them.
pub struct Master {
    pub requests: AtomicUsize,
    script: Script,
}

impl Service for Master {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let request = decode_request(header.opcode_code, body).unwrap();
        match (self.script)(&request) {
            Some((Status::Ok, response)) => {
                encode_response(out, header.request_id, Status::Ok, &response);
                Handled::Done
            }
            Some((status, _)) => {
                encode_error_response(out, header.request_id, header.opcode_code, status, "");
                Handled::Done
            }
            None => Handled::Later(Box::pin(std::future::pending())),
        }
    }
}

pub fn master(
    script: impl Fn(&Request) -> Option<(Status, Response)> + Send + Sync + 'static,
) -> Arc<Master> {
    Arc::new(Master { requests: AtomicUsize::new(0), script: Box::new(script) })
}

/// The version every healthy scripted master reports.
pub const VERSION: Version = Version(3);

/// A healthy master's answer to `request`: every object exists with value "value" at
/// [`VERSION`], every write succeeds at version 4, an increment's result is its delta.
pub fn healthy_answer(request: &Request) -> Option<(Status, Response)> {
    let value = Bytes::from_static(b"value");
    let response = match request {
        Request::Read { .. } => Response::Read { version: VERSION, value, expires_in_millis: 0 },
        Request::Write { .. } => Response::Write { version: Version(4) },
        Request::Remove { .. } => Response::Remove { version: VERSION },
        Request::Increment { delta, .. } => {
            Response::Increment { version: Version(4), value: *delta }
        }
        Request::MultiRead { items } => Response::MultiRead {
            results: items
                .iter()
                .map(|_| ReadItemResult {
                    status: Status::Ok,
                    version: VERSION,
                    value: value.clone(),
                })
                .collect(),
        },
        Request::MultiWrite { items } => Response::MultiWrite {
            results: items
                .iter()
                .map(|_| VersionItemResult { status: Status::Ok, version: Version(4) })
                .collect(),
        },
        Request::MultiRemove { items } => Response::MultiRemove {
            results: items
                .iter()
                .map(|_| VersionItemResult { status: Status::Ok, version: VERSION })
                .collect(),
        },
        Request::MultiIncrement { items } => Response::MultiIncrement {
            results: items
                .iter()
                .map(|item| IncrementItemResult {
                    status: Status::Ok,
                    version: Version(4),
                    value: item.delta,
                })
                .collect(),
        },
        Request::Enumerate { .. } => Response::Enumerate {
            objects: vec![EnumeratedObject {
                key: Bytes::from_static(b"key"),
                value,
                version: VERSION,
                expires_at: None,
            }],
            next: None,
        },
        Request::GetServerStatistics => {
            Response::GetServerStatistics { statistics: ServerStatistics::default() }
        }
        _ => return Some((Status::UnimplementedRequest, Response::Ping)),
    };
    Some((Status::Ok, response))
}

/// A healthy master (see [`healthy_answer`]).
pub fn healthy_master() -> Arc<Master> {
    master(healthy_answer)
}

/// Serves `service` on a free loopback port, on the current runtime; returns its address.
pub async fn serve(service: Arc<dyn Service>) -> String {
    serve_dying(service, 0).await.0
}

/// Serves `service` on a free loopback port, but on each of the first `dying` connections
/// completes the handshake, waits for a request and closes the connection without answering
/// (a server killed with the request in flight, and started again at the same address);
/// returns its address and the connections it accepted.
pub async fn serve_dying(service: Arc<dyn Service>, dying: usize) -> (String, Arc<AtomicUsize>) {
    let environment = stratus_env::Environment::system();
    let mut listener = environment.network.bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_address();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        while let Ok(connection) = listener.accept().await {
            if counted.fetch_add(1, Ordering::SeqCst) < dying {
                die_under_first_request(connection).await;
            } else {
                tokio::spawn(stratus_rpc::server::serve_connection(connection, service.clone()));
            }
        }
    });
    (address, accepted)
}

async fn die_under_first_request(connection: Connection) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Connection { mut reader, mut writer, .. } = connection;
    let mut hello = [0u8; HELLO_BYTES];
    if reader.read_exact(&mut hello).await.is_err() {
        return;
    }
    let welcome = Hello { version: PROTOCOL_VERSION, status: Status::Ok };
    if writer.write_all(&welcome.encode()).await.is_err() {
        return;
    }
    let mut request = [0u8; 64];
    let _ = reader.read(&mut request).await;
}

/// An address where nothing listens (a master that died): connecting is refused.
pub fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}
