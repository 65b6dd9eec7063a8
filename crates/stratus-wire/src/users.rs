//! Named users: their grants, their stored credentials, the directory the coordinator hands
//! its servers, and what every request needs of the user who sends it.
//!
//! The model (docs/design/security.md, "Users"): a user has a name, a password (kept only as
//! SCRAM-style stored keys, [`UserCredentials`]), an enabled flag and a list of grants, each a
//! table-name pattern with the access it gives ([`TableAccess`]: read, write, admin). A
//! request's access is [`Request::access_needed`], an exhaustive match, so a new opcode cannot
//! be added without deciding what it needs. The byte layouts are in wire-protocol.md, "Users".

use std::fmt;

use stratus_types::limits::{
    GRANTS_PER_USER_MAX, TABLE_PATTERN_BYTES_MAX, USERS_MAX, USER_NAME_BYTES_MAX,
};
use stratus_types::{TableId, TxOpKind};

use crate::message::{Access, Request};

/// Bytes of a user's salt (random, chosen when the password is set).
pub const USER_SALT_BYTES: usize = 16;

/// Bytes of a stored key and of a server key (SHA-256 and HMAC-SHA-256 outputs).
pub const USER_KEY_BYTES: usize = 32;

/// What a grant allows on the tables it names; a bit set on the wire (one byte).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TableAccess(u8);

impl TableAccess {
    /// Nothing.
    pub const NONE: TableAccess = TableAccess(0);
    /// Read objects: READ, MULTI_READ, ENUMERATE, a transaction's reads.
    pub const READ: TableAccess = TableAccess(1);
    /// Change objects: WRITE, REMOVE, SET_EXPIRY, INCREMENT (with READ), a transaction's
    /// writes and its decision.
    pub const WRITE: TableAccess = TableAccess(2);
    /// Create, drop, split and migrate the table; with the pattern `*`, manage users and
    /// accept data loss (a cluster administrator).
    pub const ADMIN: TableAccess = TableAccess(4);
    /// Every access.
    pub const ALL: TableAccess = TableAccess(7);

    /// The bit set, as on the wire.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The access with these bits, if every bit is defined.
    pub const fn from_bits(bits: u8) -> Option<TableAccess> {
        if bits & !TableAccess::ALL.0 == 0 {
            Some(TableAccess(bits))
        } else {
            None
        }
    }

    /// Both accesses.
    pub const fn union(self, other: TableAccess) -> TableAccess {
        TableAccess(self.0 | other.0)
    }

    /// True if this access includes all of `needed`.
    pub const fn covers(self, needed: TableAccess) -> bool {
        self.0 & needed.0 == needed.0
    }

    /// True if this is no access at all.
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }

    /// Parses letters `r`, `w`, `a` in any order and case (`rw`, `RWA`); refuses anything else
    /// and the empty string.
    pub fn parse_letters(letters: &str) -> Option<TableAccess> {
        if letters.is_empty() {
            return None;
        }
        let mut access = TableAccess::NONE;
        for letter in letters.chars() {
            access = access.union(match letter.to_ascii_lowercase() {
                'r' => TableAccess::READ,
                'w' => TableAccess::WRITE,
                'a' => TableAccess::ADMIN,
                _ => return None,
            });
        }
        Some(access)
    }
}

impl fmt::Display for TableAccess {
    /// `rwa`, with `-` for each access missing (`r--`, `rw-`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let letter = |access: TableAccess, letter: char| {
            if self.covers(access) {
                letter
            } else {
                '-'
            }
        };
        write!(
            f,
            "{}{}{}",
            letter(TableAccess::READ, 'r'),
            letter(TableAccess::WRITE, 'w'),
            letter(TableAccess::ADMIN, 'a')
        )
    }
}

impl fmt::Debug for TableAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableAccess({self})")
    }
}

/// One grant: the tables whose names match `pattern` (`*` any run of characters, `?` one
/// character, everything else itself) and what the user may do on them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableGrant {
    /// A table-name pattern (1..=`TABLE_PATTERN_BYTES_MAX` bytes).
    pub pattern: String,
    /// What it allows (not empty).
    pub access: TableAccess,
}

impl TableGrant {
    /// Checks the pattern's length and that the grant gives something.
    pub fn validate(&self) -> Result<(), String> {
        if self.pattern.is_empty() || self.pattern.len() > TABLE_PATTERN_BYTES_MAX {
            return Err(format!(
                "a table pattern has 1 to {TABLE_PATTERN_BYTES_MAX} bytes, not {}",
                self.pattern.len()
            ));
        }
        if self.access.is_none() {
            return Err(format!("the grant on {:?} gives no access", self.pattern));
        }
        Ok(())
    }
}

impl fmt::Display for TableGrant {
    /// `PATTERN=rwa`, the form the CLI takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let letters: String = self.access.to_string().chars().filter(|c| *c != '-').collect();
        write!(f, "{}={letters}", self.pattern)
    }
}

/// A user's password as the cluster keeps it (SCRAM's, RFC 5802, with Argon2id in place of
/// PBKDF2): `salted = Argon2id(password, salt)`, `stored_key = SHA-256(HMAC(salted, "Client
/// Key"))`, `server_key = HMAC(salted, "Server Key")`. A server checks a client's proof with
/// the stored key and proves itself with the server key, and neither lets anyone log in as the
/// user: a stolen record gives an offline guessing target at one Argon2id per guess, nothing
/// more. Derived in stratus-rpc; this crate only carries the bytes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UserCredentials {
    /// Random, per password.
    pub salt: [u8; USER_SALT_BYTES],
    /// SHA-256 of the client key.
    pub stored_key: [u8; USER_KEY_BYTES],
    /// The key the server proves itself with.
    pub server_key: [u8; USER_KEY_BYTES],
}

impl fmt::Debug for UserCredentials {
    /// Never shows the keys: a Debug print may reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UserCredentials(<redacted>)")
    }
}

/// A user, as the coordinator keeps it and as SET_USER sets it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UserRecord {
    /// The name ([`validate_user_name`]).
    pub name: String,
    /// A disabled user cannot authenticate (its open connections are refused every request).
    pub enabled: bool,
    /// The password's stored keys. `None` in SET_USER keeps the user's current password (a new
    /// user without one cannot authenticate until it is given one).
    pub credentials: Option<UserCredentials>,
    /// What the user may do (at most `GRANTS_PER_USER_MAX`).
    pub grants: Vec<TableGrant>,
}

impl UserRecord {
    /// Checks the name, the grants and their number.
    pub fn validate(&self) -> Result<(), String> {
        validate_user_name(&self.name)?;
        if self.grants.len() > GRANTS_PER_USER_MAX {
            return Err(format!(
                "a user has at most {GRANTS_PER_USER_MAX} grants, not {}",
                self.grants.len()
            ));
        }
        self.grants.iter().try_for_each(TableGrant::validate)
    }

    /// What the user may do on the table named `table`: every matching grant's access.
    pub fn access_to(&self, table: &str) -> TableAccess {
        grants_access_to(&self.grants, table)
    }

    /// True if the user administers the cluster: a grant of ADMIN on the pattern `*`.
    pub fn is_cluster_admin(&self) -> bool {
        self.enabled && grants_make_cluster_admin(&self.grants)
    }
}

/// What `grants` allow on the table named `table`.
pub fn grants_access_to(grants: &[TableGrant], table: &str) -> TableAccess {
    grants
        .iter()
        .filter(|grant| pattern_matches(&grant.pattern, table))
        .fold(TableAccess::NONE, |access, grant| access.union(grant.access))
}

/// True if `grants` include ADMIN on every table (the pattern `*`).
pub fn grants_make_cluster_admin(grants: &[TableGrant]) -> bool {
    grants.iter().any(|grant| grant.pattern == "*" && grant.access.covers(TableAccess::ADMIN))
}

/// A user as LIST_USERS shows it: no keys, only whether it has a password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserSummary {
    /// The name.
    pub name: String,
    /// Whether it may authenticate.
    pub enabled: bool,
    /// Whether it has a password (a user without one cannot authenticate).
    pub has_password: bool,
    /// Its grants.
    pub grants: Vec<TableGrant>,
}

impl UserSummary {
    /// The summary of `user`.
    pub fn of(user: &UserRecord) -> UserSummary {
        UserSummary {
            name: user.name.clone(),
            enabled: user.enabled,
            has_password: user.credentials.is_some(),
            grants: user.grants.clone(),
        }
    }
}

/// Who a connection is, as WHO_AM_I answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// The server runs without a cluster secret: every connection may do everything.
    Open,
    /// The connection proved the cluster secret.
    Member,
    /// The connection proved the client password: the default user, who may do everything a
    /// client may.
    Default,
    /// The connection proved nothing, on a cluster that requires no client password: every
    /// client opcode, on every table.
    Anonymous,
    /// The connection proved a named user's password.
    User {
        /// The name.
        name: String,
        /// Its grants, as the server answering knows them.
        grants: Vec<TableGrant>,
    },
}

impl Identity {
    /// The name Redis's ACL WHOAMI would give: the user's, or `default`.
    pub fn user_name(&self) -> &str {
        match self {
            Identity::User { name, .. } => name,
            _ => "default",
        }
    }
}

/// The users and what a server needs to resolve their grants, as the coordinator hands it to
/// its servers (GET_USER_DIRECTORY).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserDirectorySnapshot {
    /// Changes whenever anything below does (a digest of the rest, chosen by the coordinator;
    /// 0 is never used, so a server that knows nothing asks with 0).
    pub version: u64,
    /// Every table id below this one was created before the snapshot: a table id at or above
    /// it is newer than the snapshot, and a server waits for the next one to judge it.
    pub next_table_id: TableId,
    /// Every user, with its stored keys, ascending by name.
    pub users: Vec<UserRecord>,
    /// The names of the tables that some grant's pattern other than `*` matches (a table
    /// missing here and below `next_table_id` matches only `*` grants, or was dropped),
    /// ascending by id.
    pub tables: Vec<(TableId, String)>,
}

impl UserDirectorySnapshot {
    /// The user named `name`.
    pub fn user(&self, name: &str) -> Option<&UserRecord> {
        self.users
            .binary_search_by(|user| user.name.as_str().cmp(name))
            .ok()
            .map(|index| &self.users[index])
    }

    /// The name of table `table_id`, if the snapshot has it.
    pub fn table_name(&self, table_id: TableId) -> Option<&str> {
        self.tables
            .binary_search_by_key(&table_id, |(id, _)| *id)
            .ok()
            .map(|index| self.tables[index].1.as_str())
    }

    /// What `grants` allow on table `table_id`, or `None` when the snapshot is older than the
    /// table (the caller waits for a newer one).
    pub fn access_by_id(&self, grants: &[TableGrant], table_id: TableId) -> Option<TableAccess> {
        if table_id.0 >= self.next_table_id.0 {
            return None;
        }
        Some(match self.table_name(table_id) {
            Some(name) => grants_access_to(grants, name),
            // Named by no specific pattern: only the grants on every table apply.
            None => grants
                .iter()
                .filter(|grant| grant.pattern == "*")
                .fold(TableAccess::NONE, |access, grant| access.union(grant.access)),
        })
    }

    /// True if some grant of some user names tables by a pattern other than `*`, so the
    /// snapshot must carry the names of the tables it matches.
    pub fn pattern_needs_name(pattern: &str) -> bool {
        pattern != "*"
    }

    /// Checks the bounds and the orders a decoder or a server relies on.
    pub fn validate(&self) -> Result<(), String> {
        if self.users.len() > USERS_MAX {
            return Err(format!("{} users; at most {USERS_MAX}", self.users.len()));
        }
        if !self.users.windows(2).all(|pair| pair[0].name < pair[1].name) {
            return Err("users are not in ascending order of name".to_string());
        }
        if !self.tables.windows(2).all(|pair| pair[0].0 < pair[1].0) {
            return Err("tables are not in ascending order of id".to_string());
        }
        self.users.iter().try_for_each(UserRecord::validate)
    }
}

/// Checks a user name: 1 to `USER_NAME_BYTES_MAX` bytes of ASCII letters, digits and `_ . @ -`
/// (names appear in logs, in Redis's ACL LIST lines and in the preamble).
pub fn validate_user_name(name: &str) -> Result<(), String> {
    let allowed = |byte: u8| byte.is_ascii_alphanumeric() || b"_.@-".contains(&byte);
    if name.is_empty() || name.len() > USER_NAME_BYTES_MAX {
        return Err(format!(
            "a user name has 1 to {USER_NAME_BYTES_MAX} bytes, not {}",
            name.len()
        ));
    }
    if !name.bytes().all(allowed) {
        return Err(format!(
            "user name {name:?}: only ASCII letters, digits and _ . @ - are allowed"
        ));
    }
    if name == "default" {
        return Err("\"default\" is the client password's user; choose another name".to_string());
    }
    Ok(())
}

/// True if `name` matches `pattern`: `*` matches any run of characters (none included), `?`
/// exactly one, every other character itself. Linear in the lengths' product at worst (no
/// backtracking blow-up: the classic two-pointer match with one saved star).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && (pattern[p] == '?' || (pattern[p] != '*' && pattern[p] == name[n]))
        {
            p += 1;
            n += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some((p, n));
            p += 1;
        } else if let Some((star_p, star_n)) = star {
            p = star_p + 1;
            n = star_n + 1;
            star = Some((star_p, star_n + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// What a request needs of the user who sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessNeeded<'a> {
    /// Nothing beyond being authenticated (PING, metadata, leases, statistics).
    Nothing,
    /// Only cluster members send it (the opcode's [`Access::Member`]).
    Member,
    /// A cluster administrator (ADMIN on `*`): user management, accepting data loss.
    ClusterAdmin,
    /// `access` on the table named `name` (the coordinator's table operations).
    TableNamed(&'a str, TableAccess),
    /// What each listed table needs (data operations); a table may appear more than once.
    Tables(Vec<(TableId, TableNeed)>),
}

/// What one table of a data operation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableNeed {
    /// Every access named.
    All(TableAccess),
    /// Read or write: an operation of a transaction named without its kind (a participant,
    /// a decision), which is a read or a write.
    ReadOrWrite,
}

impl TableNeed {
    /// True if `has` satisfies this need.
    pub fn met_by(self, has: TableAccess) -> bool {
        match self {
            TableNeed::All(needed) => has.covers(needed),
            TableNeed::ReadOrWrite => {
                has.covers(TableAccess::READ) || has.covers(TableAccess::WRITE)
            }
        }
    }
}

impl fmt::Display for TableNeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableNeed::All(access) => write!(f, "{access}"),
            TableNeed::ReadOrWrite => f.write_str("r-- or -w-"),
        }
    }
}

fn tx_op_need(kind: TxOpKind) -> TableNeed {
    match kind {
        TxOpKind::Read => TableNeed::All(TableAccess::READ),
        TxOpKind::Write | TxOpKind::Remove => TableNeed::All(TableAccess::WRITE),
    }
}

impl Request {
    /// What this request needs of a named user. The match names every request, so a new one
    /// cannot be added without deciding.
    pub fn access_needed(&self) -> AccessNeeded<'_> {
        use AccessNeeded::{ClusterAdmin, Nothing, TableNamed, Tables};
        let all = TableNeed::All;
        let one = |table_id: TableId, access: TableAccess| Tables(vec![(table_id, all(access))]);
        let read_write = TableAccess::READ.union(TableAccess::WRITE);
        let each = |tables: &mut dyn Iterator<Item = TableId>, need: TableNeed| {
            Tables(tables.map(|table_id| (table_id, need)).collect())
        };
        match self {
            Request::Ping
            | Request::GetServerList
            | Request::GetTableId { .. }
            | Request::ListTables
            | Request::GetTabletMap { .. }
            | Request::AwaitTabletMap { .. }
            | Request::ClientLease { .. }
            | Request::GetServerStatistics
            | Request::BackupGetStatistics
            | Request::WhoAmI => Nothing,
            Request::CreateTable { name, .. }
            | Request::DropTable { name }
            | Request::SplitTablet { name, .. }
            | Request::MigrateTablet { name, .. } => TableNamed(name, TableAccess::ADMIN),
            Request::RecoveryAcceptLoss { .. }
            | Request::SetUser { .. }
            | Request::DeleteUser { .. }
            | Request::ListUsers => ClusterAdmin,
            Request::Read { table_id, .. } | Request::Enumerate { table_id, .. } => {
                one(*table_id, TableAccess::READ)
            }
            Request::Write { table_id, .. }
            | Request::SetExpiry { table_id, .. }
            | Request::Remove { table_id, .. } => one(*table_id, TableAccess::WRITE),
            // The answer carries the new value: an increment reads as well as writes.
            Request::Increment { table_id, .. } => one(*table_id, read_write),
            Request::MultiRead { items } => {
                each(&mut items.iter().map(|item| item.table_id), all(TableAccess::READ))
            }
            Request::MultiWrite { items } => {
                each(&mut items.iter().map(|item| item.table_id), all(TableAccess::WRITE))
            }
            Request::MultiRemove { items } => {
                each(&mut items.iter().map(|item| item.table_id), all(TableAccess::WRITE))
            }
            Request::MultiIncrement { items } => {
                each(&mut items.iter().map(|item| item.table_id), all(read_write))
            }
            // The participants too: a participant finishing the transaction for a silent
            // client decides every one of them, as a member, on any master.
            Request::TxPrepare { ops, participants, .. } => Tables(
                ops.iter()
                    .map(|op| (op.table_id, tx_op_need(op.kind)))
                    .chain(participants.iter().map(|op| (op.table_id, TableNeed::ReadOrWrite)))
                    .collect(),
            ),
            // A decision names each operation of the transaction, reads included, without its
            // kind: it needs what a read or a write of the table needs.
            Request::TxDecision { ops, .. } | Request::TxRequestAbort { ops, .. } => {
                each(&mut ops.iter().map(|op| op.table_id), TableNeed::ReadOrWrite)
            }
            Request::EnlistServer { .. }
            | Request::RenewLease { .. }
            | Request::SetLogHead { .. }
            | Request::HintServerCrashed { .. }
            | Request::ServerStopping { .. }
            | Request::CheckClientLeases { .. }
            | Request::TakeTabletOwnership { .. }
            | Request::DropTabletOwnership { .. }
            | Request::RecoverTablets { .. }
            | Request::TransferTablet { .. }
            | Request::ReceiveMigrationData { .. }
            | Request::ReplicasNeeded { .. }
            | Request::AbandonMigration { .. }
            | Request::GetUserDirectory { .. }
            | Request::BackupWrite { .. }
            | Request::BackupFree { .. }
            | Request::BackupListReplicas { .. }
            | Request::BackupReadReplica { .. }
            | Request::BackupFenceMaster { .. }
            | Request::BackupGetRecoveryData { .. }
            | Request::BackupStartPartitioning { .. } => {
                debug_assert_eq!(self.opcode().access(), Access::Member);
                AccessNeeded::Member
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_like_globs() {
        for (pattern, name, expected) in [
            ("*", "anything", true),
            ("*", "", true),
            ("orders", "orders", true),
            ("orders", "orders2", false),
            ("redis-db-*", "redis-db-0", true),
            ("redis-db-*", "redis-db-", true),
            ("redis-db-*", "redis-d", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*a*b*", "xxaxxbxx", true),
            ("*a*b*", "xxbxxaxx", false),
            ("t-*-x", "t-1-2-x", true),
            ("é*", "été", true),
        ] {
            assert_eq!(pattern_matches(pattern, name), expected, "{pattern} ~ {name}");
        }
        // A pathological pattern still answers quickly (no exponential backtracking).
        let name = "a".repeat(200);
        assert!(!pattern_matches(&format!("{}b", "*a".repeat(100)), &name));
    }

    #[test]
    fn access_letters_parse_and_print() {
        assert_eq!(TableAccess::parse_letters("rw"), Some(TableAccess(3)));
        assert_eq!(TableAccess::parse_letters("AWR"), Some(TableAccess::ALL));
        assert_eq!(TableAccess::parse_letters(""), None);
        assert_eq!(TableAccess::parse_letters("rx"), None);
        assert_eq!(TableAccess::READ.to_string(), "r--");
        assert_eq!(TableAccess::from_bits(8), None);
        let grant = TableGrant { pattern: "t*".into(), access: TableAccess(5) };
        assert_eq!(grant.to_string(), "t*=ra");
    }

    #[test]
    fn grants_combine_and_the_directory_resolves_ids() {
        let grants = vec![
            TableGrant { pattern: "orders".into(), access: TableAccess::READ },
            TableGrant { pattern: "ord*".into(), access: TableAccess::WRITE },
            TableGrant { pattern: "*".into(), access: TableAccess::READ },
        ];
        assert_eq!(grants_access_to(&grants, "orders"), TableAccess(3));
        assert_eq!(grants_access_to(&grants, "other"), TableAccess::READ);
        assert!(!grants_make_cluster_admin(&grants));
        let directory = UserDirectorySnapshot {
            version: 1,
            next_table_id: TableId(10),
            users: vec![],
            tables: vec![(TableId(3), "orders".into())],
        };
        assert_eq!(directory.access_by_id(&grants, TableId(3)), Some(TableAccess(3)));
        assert_eq!(directory.access_by_id(&grants, TableId(4)), Some(TableAccess::READ));
        assert_eq!(directory.access_by_id(&grants, TableId(10)), None, "newer than the snapshot");
    }

    #[test]
    fn user_names_are_checked() {
        assert!(validate_user_name("alice").is_ok());
        assert!(validate_user_name("svc.orders-reader@prod_1").is_ok());
        assert!(validate_user_name("").is_err());
        assert!(validate_user_name("default").is_err());
        assert!(validate_user_name("al ice").is_err());
        assert!(validate_user_name(&"a".repeat(USER_NAME_BYTES_MAX + 1)).is_err());
    }
}
