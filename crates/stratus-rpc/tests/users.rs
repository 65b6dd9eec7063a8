//! Named users over loopback TCP: every client opcode, sent by users with different grants, is
//! served or refused exactly as a table written here (independently of
//! `Request::access_needed`) says; wrong passwords, unknown and disabled users fail alike; a
//! changed directory applies to open connections; a request naming a table newer than the
//! server's directory waits for the next one.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stratus_env::{Network, OsEntropy, TcpNetwork};
use stratus_rpc::{
    new_user_credentials, serve_admitting, Admission, Channel, ClientNetwork, ClusterKey, Handled,
    Membership, RpcConfig, Service, UserDirectory, UserPassword,
};
use stratus_types::{Expiry, LeaseId, RejectRules, RpcId, ServerId, TableId, TxDecision, TxOpKind};
use stratus_types::{HashRange, Version};
use stratus_wire::{
    begin_request, decode_frame_header, encode_error_response, finish_frame, Access,
    EnumerationCursor, FrameHeader, Identity, IncrementItem, KeyItem, Opcode, RemoveItem, Request,
    ResponseBody, Status, TableAccess, TableGrant, TxDecisionOp, TxOp, UserDirectorySnapshot,
    UserRecord, WriteItem,
};

const SECRET: &[u8] = b"a cluster secret for the user tests";
const CLIENT_PASSWORD: &[u8] = b"the default user's password";
const PASSWORD: &[u8] = b"every user's password here";
const TIMEOUT: Duration = Duration::from_secs(10);
const ORDERS: TableId = TableId(1);
const LOGS: TableId = TableId(2);

/// Answers every request with INVALID_PARAMETER "reached", so a test can tell a request the
/// service saw from one the RPC layer refused.
struct Reached {
    handled: AtomicU64,
}

impl Service for Reached {
    fn handle(&self, header: &FrameHeader, _body: Bytes, out: &mut BytesMut) -> Handled {
        self.handled.fetch_add(1, Ordering::Relaxed);
        let status = Status::InvalidParameter;
        encode_error_response(out, header.request_id, header.opcode_code, status, "reached");
        Handled::Done
    }
}

fn grant(pattern: &str, letters: &str) -> TableGrant {
    TableGrant {
        pattern: pattern.to_string(),
        access: TableAccess::parse_letters(letters).expect("letters"),
    }
}

fn user(name: &str, enabled: bool, grants: Vec<TableGrant>) -> UserRecord {
    let credentials = Some(new_user_credentials(PASSWORD).expect("credentials"));
    UserRecord { name: name.to_string(), enabled, credentials, grants }
}

fn directory(version: u64, next_table_id: u64, users: Vec<UserRecord>) -> UserDirectorySnapshot {
    let mut users = users;
    users.sort_by(|a, b| a.name.cmp(&b.name));
    let mut tables = vec![(ORDERS, "orders".to_string()), (LOGS, "logs".to_string())];
    if next_table_id > 5 {
        tables.push((TableId(5), "orders-new".to_string()));
    }
    UserDirectorySnapshot { version, next_table_id: TableId(next_table_id), users, tables }
}

struct Server {
    address: String,
    users: Arc<UserDirectory>,
    membership: Arc<Membership>,
    service: Arc<Reached>,
}

async fn start(snapshot: UserDirectorySnapshot) -> Server {
    let client_key = ClusterKey::from_client_password(CLIENT_PASSWORD).expect("key");
    let membership = Membership::with_options(
        ClusterKey::from_secret(SECRET).expect("key"),
        Some(client_key),
        Arc::new(OsEntropy),
        Duration::from_millis(10),
    );
    let users = Arc::new(UserDirectory::new());
    users.install(snapshot);
    membership.serve_users(users.clone());
    let listener = TcpNetwork.bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_address();
    let service = Arc::new(Reached { handled: AtomicU64::new(0) });
    tokio::spawn(serve_admitting(
        listener,
        service.clone(),
        Admission::Members(membership.clone()),
    ));
    Server { address, users, membership, service }
}

async fn connect_as(address: &str, name: &str, password: &[u8]) -> std::io::Result<Channel> {
    let user = Arc::new(UserPassword::new(name, password).expect("valid"));
    let network = ClientNetwork::for_user(Arc::new(TcpNetwork), user, Arc::new(OsEntropy));
    Channel::connect(&network, address, &RpcConfig::default()).await.map_err(|error| {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, error.to_string())
    })
}

/// What a request needs, written out by hand for this test.
#[derive(Clone, Copy, Debug)]
enum Need {
    Nothing,
    Member,
    ClusterAdmin,
    On(TableId, &'static str),
    /// Read or write on the table (a transaction's operation named without its kind).
    ReadOrWriteOn(TableId),
    /// TX_PREPARE: write on `orders` (its op), and read or write on `logs` (a participant).
    Prepare,
    Named(&'static str, &'static str),
}

fn key() -> Bytes {
    Bytes::from_static(b"k")
}

/// One request for every opcode, with what it needs; member-only opcodes are sent with an
/// empty body (the RPC layer refuses them before decoding).
fn requests() -> Vec<(Opcode, Option<Request>, Need)> {
    use Need::*;
    let rules = RejectRules::default();
    let decision_op = TxDecisionOp { table_id: ORDERS, key_hash: 5, rpc: RpcId(12) };
    let tx_op = |kind: TxOpKind, value: &'static [u8]| TxOp {
        table_id: ORDERS,
        key: key(),
        rpc: RpcId(12),
        kind,
        version_read: Version(3),
        value: Bytes::from_static(value),
    };
    let prepare = |kind, value| Request::TxPrepare {
        lease: LeaseId(7),
        acknowledged: RpcId(10),
        transaction: RpcId(12),
        validate_only: false,
        ops: vec![tx_op(kind, value)],
        participants: vec![
            decision_op,
            TxDecisionOp { table_id: LOGS, key_hash: 6, rpc: RpcId(13) },
        ],
    };
    let mut list: Vec<(Opcode, Option<Request>, Need)> = vec![
        (Opcode::Ping, Some(Request::Ping), Nothing),
        (Opcode::GetServerList, Some(Request::GetServerList), Nothing),
        (
            Opcode::CreateTable,
            Some(Request::CreateTable {
                name: "orders".into(),
                server_span: 1,
                tier: stratus_types::Tier::Memory,
            }),
            Named("orders", "a"),
        ),
        (Opcode::DropTable, Some(Request::DropTable { name: "logs".into() }), Named("logs", "a")),
        (Opcode::GetTableId, Some(Request::GetTableId { name: "logs".into() }), Nothing),
        (Opcode::ListTables, Some(Request::ListTables), Nothing),
        (Opcode::GetTabletMap, Some(Request::GetTabletMap { table_id: LOGS }), Nothing),
        (
            Opcode::AwaitTabletMap,
            Some(Request::AwaitTabletMap {
                table_id: LOGS,
                wait_millis: 100,
                stale_owner: ServerId(0),
            }),
            Nothing,
        ),
        (
            Opcode::RecoveryAcceptLoss,
            Some(Request::RecoveryAcceptLoss { server_id: ServerId(3) }),
            ClusterAdmin,
        ),
        (
            Opcode::SplitTablet,
            Some(Request::SplitTablet { name: "orders".into(), split_hash: 9 }),
            Named("orders", "a"),
        ),
        (
            Opcode::MigrateTablet,
            Some(Request::MigrateTablet {
                name: "orders".into(),
                start_hash: 0,
                target: ServerId(2),
            }),
            Named("orders", "a"),
        ),
        (Opcode::ClientLease, Some(Request::ClientLease { lease: LeaseId(0) }), Nothing),
        (
            Opcode::SetUser,
            Some(Request::SetUser { user: user("carol", true, vec![grant("*", "r")]) }),
            ClusterAdmin,
        ),
        (Opcode::DeleteUser, Some(Request::DeleteUser { name: "carol".into() }), ClusterAdmin),
        (Opcode::ListUsers, Some(Request::ListUsers), ClusterAdmin),
        (Opcode::WhoAmI, Some(Request::WhoAmI), Nothing),
        (
            Opcode::Read,
            Some(Request::Read { table_id: ORDERS, key: key(), rules }),
            On(ORDERS, "r"),
        ),
        (
            Opcode::Write,
            Some(Request::Write {
                table_id: ORDERS,
                key: key(),
                value: Bytes::from_static(b"v"),
                rules,
                expiry: Expiry::Never,
                rpc: None,
            }),
            On(ORDERS, "w"),
        ),
        (
            Opcode::Remove,
            Some(Request::Remove { table_id: LOGS, key: key(), rules, rpc: None }),
            On(LOGS, "w"),
        ),
        (
            Opcode::Increment,
            Some(Request::Increment { table_id: ORDERS, key: key(), delta: 1, rules, rpc: None }),
            On(ORDERS, "rw"),
        ),
        (
            Opcode::MultiRead,
            Some(Request::MultiRead {
                items: vec![
                    KeyItem { table_id: ORDERS, key: key(), rules },
                    KeyItem { table_id: LOGS, key: key(), rules },
                ],
            }),
            // Both tables: checked below as the weaker of the two users' grants.
            On(LOGS, "r"),
        ),
        (
            Opcode::MultiWrite,
            Some(Request::MultiWrite {
                items: vec![WriteItem {
                    table_id: ORDERS,
                    key: key(),
                    value: Bytes::from_static(b"v"),
                    rules,
                    expiry: Expiry::Never,
                    rpc: None,
                }],
            }),
            On(ORDERS, "w"),
        ),
        (
            Opcode::MultiRemove,
            Some(Request::MultiRemove {
                items: vec![RemoveItem { table_id: ORDERS, key: key(), rules, rpc: None }],
            }),
            On(ORDERS, "w"),
        ),
        (
            Opcode::MultiIncrement,
            Some(Request::MultiIncrement {
                items: vec![IncrementItem {
                    table_id: ORDERS,
                    key: key(),
                    delta: 2,
                    rules,
                    rpc: None,
                }],
            }),
            On(ORDERS, "rw"),
        ),
        (
            Opcode::Enumerate,
            Some(Request::Enumerate {
                table_id: LOGS,
                range: HashRange { start: 0, end: u64::MAX },
                cursor: EnumerationCursor { reversed_hash: 0, after_key: None },
                bytes_max: 1024,
            }),
            On(LOGS, "r"),
        ),
        (
            Opcode::SetExpiry,
            Some(Request::SetExpiry {
                table_id: ORDERS,
                key: key(),
                expiry: Expiry::Never,
                rules,
                rpc: None,
            }),
            On(ORDERS, "w"),
        ),
        (Opcode::GetServerStatistics, Some(Request::GetServerStatistics), Nothing),
        (Opcode::TxPrepare, Some(prepare(TxOpKind::Write, b"v")), Prepare),
        (
            Opcode::TxDecision,
            Some(Request::TxDecision {
                lease: LeaseId(7),
                acknowledged: RpcId(10),
                transaction: RpcId(12),
                decision: TxDecision::Abort,
                ops: vec![decision_op],
            }),
            ReadOrWriteOn(ORDERS),
        ),
        (
            Opcode::TxRequestAbort,
            Some(Request::TxRequestAbort {
                lease: LeaseId(7),
                transaction: RpcId(12),
                ops: vec![decision_op],
            }),
            ReadOrWriteOn(ORDERS),
        ),
        (Opcode::BackupGetStatistics, Some(Request::BackupGetStatistics), Nothing),
    ];
    for opcode in Opcode::ALL {
        if opcode.access() == Access::Member {
            list.push((opcode, None, Member));
        }
    }
    list
}

/// What `grants` give on `table` (by its name in the test directory).
fn has(grants: &[TableGrant], table: TableId, letters: &str) -> bool {
    let name = if table == ORDERS { "orders" } else { "logs" };
    has_named(grants, name, letters)
}

fn has_named(grants: &[TableGrant], name: &str, letters: &str) -> bool {
    let needed = TableAccess::parse_letters(letters).expect("letters");
    let granted = grants
        .iter()
        .filter(|grant| grant.pattern == "*" || grant.pattern == name)
        .fold(TableAccess::NONE, |access, grant| access.union(grant.access));
    granted.covers(needed)
}

fn allowed(grants: &[TableGrant], opcode: Opcode, need: Need) -> bool {
    match need {
        Need::Nothing => true,
        Need::Member => false,
        Need::ClusterAdmin => grants
            .iter()
            .any(|grant| grant.pattern == "*" && grant.access.covers(TableAccess::ADMIN)),
        // MULTI_READ names both tables.
        Need::On(table, letters) if opcode == Opcode::MultiRead => {
            has(grants, table, letters) && has(grants, ORDERS, letters)
        }
        Need::On(table, letters) => has(grants, table, letters),
        Need::ReadOrWriteOn(table) => has(grants, table, "r") || has(grants, table, "w"),
        Need::Prepare => {
            has(grants, ORDERS, "w") && (has(grants, LOGS, "r") || has(grants, LOGS, "w"))
        }
        Need::Named(name, letters) => has_named(grants, name, letters),
    }
}

async fn status_of(channel: &Channel, opcode: Opcode, request: &Option<Request>) -> Status {
    match request {
        Some(request) => channel.call(request, TIMEOUT).await.expect("an answer").0,
        None => {
            let frame = channel
                .call_encoded(TIMEOUT, |out, request_id| {
                    let start = begin_request(out, request_id, opcode);
                    finish_frame(out, start).expect("an empty request fits");
                })
                .await
                .expect("an answer");
            decode_frame_header(&frame).expect("a response").status
        }
    }
}

#[tokio::test]
async fn every_opcode_is_served_or_refused_as_each_users_grants_say() {
    let users = vec![
        ("reader", vec![grant("orders", "r")]),
        ("writer", vec![grant("orders", "rw"), grant("logs", "r")]),
        ("orders-writer", vec![grant("orders", "w")]),
        ("orders-admin", vec![grant("orders", "rwa")]),
        ("root", vec![grant("*", "rwa")]),
        ("everything-but-admin", vec![grant("*", "rw")]),
        ("nothing", vec![]),
    ];
    let records = users.iter().map(|(name, grants)| user(name, true, grants.clone())).collect();
    let server = start(directory(1, 3, records)).await;
    let requests = requests();
    let covered: BTreeSet<u16> = requests.iter().map(|(opcode, ..)| opcode.code()).collect();
    let all: BTreeSet<u16> = Opcode::ALL.iter().map(|opcode| opcode.code()).collect();
    assert_eq!(covered, all, "every opcode is in the table");
    let mut refused = 0;
    for (name, grants) in &users {
        let channel = connect_as(&server.address, name, PASSWORD).await.expect("connects");
        for (opcode, request, need) in &requests {
            let expected = if !allowed(grants, *opcode, *need) {
                refused += 1;
                Status::PermissionDenied
            } else if *opcode == Opcode::WhoAmI {
                Status::Ok
            } else {
                Status::InvalidParameter
            };
            let status = status_of(&channel, *opcode, request).await;
            assert_eq!(status, expected, "{opcode:?} by {name} ({need:?})");
        }
    }
    assert!(refused > 60, "only {refused} refusals");
    // Member opcodes are counted as the membership's refusals, the rest as the users'.
    let member_refusals = server.membership.requests_refused();
    assert_eq!(member_refusals + server.users.requests_denied(), refused);
    assert_eq!(server.users.authentications_failed(), 0);
    assert!(server.service.handled.load(Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn wrong_passwords_unknown_and_disabled_users_fail_alike_and_are_counted() {
    let server = start(directory(
        1,
        3,
        vec![user("alice", true, vec![grant("*", "r")]), user("off", false, vec![grant("*", "r")])],
    ))
    .await;
    let alice = connect_as(&server.address, "alice", PASSWORD).await.expect("the right password");
    let (status, body) = alice.call(&Request::WhoAmI, TIMEOUT).await.expect("answer");
    assert_eq!(status, Status::Ok);
    let ResponseBody::Operation(stratus_wire::Response::WhoAmI { identity }) = body else {
        panic!("{body:?}")
    };
    assert_eq!(identity, Identity::User { name: "alice".into(), grants: vec![grant("*", "r")] });
    for (name, password) in
        [("alice", &b"not alice's password"[..]), ("nobody", PASSWORD), ("off", PASSWORD)]
    {
        let error = connect_as(&server.address, name, password).await.expect_err(name);
        assert!(error.to_string().contains("does not accept user"), "{name}: {error}");
    }
    // The acceptor counts a failure when it sees the connector close, which may be after the
    // connector has reported it: wait (bounded) for the count.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while server.users.authentications_failed() < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.users.authentications_failed(), 3);
    // The default user (the client password) is still a connection of its own kind.
    let key = ClusterKey::from_client_password(CLIENT_PASSWORD).expect("key");
    let network = ClientNetwork::new(Arc::new(TcpNetwork), key, Arc::new(OsEntropy));
    let default =
        Channel::connect(&network, &server.address, &RpcConfig::default()).await.expect("default");
    let (_, body) = default.call(&Request::WhoAmI, TIMEOUT).await.expect("answer");
    assert!(matches!(
        body,
        ResponseBody::Operation(stratus_wire::Response::WhoAmI { identity: Identity::Default })
    ));
}

#[tokio::test]
async fn a_name_that_fails_too_often_is_refused_unchecked_for_the_rest_of_the_second() {
    let server = start(directory(1, 3, vec![user("alice", true, vec![grant("*", "r")])])).await;
    // One UserPassword keeps its derived keys per salt: each attempt after the first costs no
    // Argon2id here, so the attempts fit well within a second.
    let wrong = Arc::new(UserPassword::new("alice", b"a wrong password").expect("valid"));
    let network = ClientNetwork::for_user(Arc::new(TcpNetwork), wrong, Arc::new(OsEntropy));
    let mut refused_unchecked = false;
    for _ in 0..200 {
        let error = Channel::connect(&network, &server.address, &RpcConfig::default())
            .await
            .expect_err("wrong password");
        if error.to_string().contains("refused to authenticate user") {
            refused_unchecked = true;
            break;
        }
    }
    assert!(refused_unchecked, "the limit never applied");
    assert!(server.users.authentications_failed() > 20);
}

#[tokio::test]
async fn a_changed_directory_applies_to_open_connections() {
    let alice = user("alice", true, vec![grant("orders", "rw")]);
    let server = start(directory(1, 3, vec![alice.clone()])).await;
    let channel = connect_as(&server.address, "alice", PASSWORD).await.expect("connects");
    let read = Request::Read { table_id: ORDERS, key: key(), rules: RejectRules::default() };
    assert_eq!(
        status_of(&channel, Opcode::Read, &Some(read.clone())).await,
        Status::InvalidParameter
    );
    let read_only = UserRecord { grants: vec![grant("logs", "r")], ..alice.clone() };
    server.users.install(directory(2, 3, vec![read_only]));
    assert_eq!(
        status_of(&channel, Opcode::Read, &Some(read.clone())).await,
        Status::PermissionDenied
    );
    // Grants back, same password: served again.
    server.users.install(directory(5, 3, vec![alice.clone()]));
    assert_eq!(
        status_of(&channel, Opcode::Read, &Some(read.clone())).await,
        Status::InvalidParameter
    );
    // A new password for alice ends the sessions that proved the old one.
    let new_password = user("alice", true, vec![grant("orders", "rw")]);
    server.users.install(directory(3, 3, vec![new_password]));
    let (status, body) = channel.call(&read, TIMEOUT).await.expect("answer");
    assert_eq!(status, Status::PermissionDenied);
    assert!(format!("{body:?}").contains("another password"), "{body:?}");
    server.users.install(directory(4, 3, vec![]));
    let (status, body) = channel.call(&read, TIMEOUT).await.expect("answer");
    assert_eq!(status, Status::PermissionDenied);
    assert!(format!("{body:?}").contains("no longer exists"), "{body:?}");
}

#[tokio::test]
async fn a_table_newer_than_the_directory_waits_for_the_next_one() {
    let prefix = user("prefix", true, vec![grant("orders*", "rw")]);
    let server = start(directory(1, 3, vec![prefix.clone()])).await;
    let channel = connect_as(&server.address, "prefix", PASSWORD).await.expect("connects");
    let read_new =
        Request::Read { table_id: TableId(5), key: key(), rules: RejectRules::default() };
    // Nothing newer comes: refused after the wait, saying why.
    let (status, body) = channel.call(&read_new, TIMEOUT).await.expect("answer");
    assert_eq!(status, Status::PermissionDenied);
    assert!(format!("{body:?}").contains("does not know yet"), "{body:?}");
    // A directory made before the table arrives first, then one naming it, during the wait:
    // served.
    let users = server.users.clone();
    let older = directory(2, 4, vec![prefix.clone()]);
    let newer = directory(3, 6, vec![prefix]);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        users.install(older);
        tokio::time::sleep(Duration::from_millis(200)).await;
        users.install(newer);
    });
    let status = status_of(&channel, Opcode::Read, &Some(read_new)).await;
    assert_eq!(status, Status::InvalidParameter, "reached the service");
}
