//! Named users: the coordinator keeps them in its MetaStore (`user/<name>`, stored keys only),
//! answers SET_USER, DELETE_USER and LIST_USERS, and hands the user directory to its servers
//! through a long poll (GET_USER_DIRECTORY), so a change reaches every server within a round
//! trip (docs/design/security.md, "Users").
//!
//! Who may send the user opcodes is the RPC layer's check (`Request::access_needed`: a cluster
//! administrator); here the coordinator validates and applies them.

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use sha2::{Digest, Sha256};
use stratus_meta::MetaOperation;
use stratus_types::limits::{USERS_MAX, USER_DIRECTORY_BYTES_MAX};
use stratus_types::TableId;
use stratus_wire::users::{pattern_matches, UserDirectorySnapshot};
use stratus_wire::{encode_response, Response, Status, UserRecord, UserSummary};
use tokio::sync::Notify;

use crate::records::{put_user, user_key, CoordinatorState, TableRecord};
use crate::service::Inner;

/// How long the coordinator holds a GET_USER_DIRECTORY whose version is current before it
/// answers "unchanged": short enough that a server notices a dead coordinator and polls its
/// successor, long enough that an idle cluster costs one request per server per few seconds.
pub const USER_DIRECTORY_POLL: Duration = Duration::from_secs(5);

/// How long SET_USER and DELETE_USER wait, after publishing, for the servers that were
/// following the directory to hold the new one (their next long poll names its version), so
/// that a changed password or a deleted user is refused by the time the change is answered.
/// A server that does not come back within it (dead, or partitioned from the coordinator)
/// does not hold the change up longer: it gets the directory when it polls again.
pub const USER_DIRECTORY_PROPAGATION_WAIT_MAX: Duration = Duration::from_secs(2);

/// The servers' long polls in flight, counted by the directory version each names: how the
/// coordinator tells that a change it published has reached the servers following it.
#[derive(Debug, Default)]
pub(crate) struct DirectoryPolls {
    in_flight_by_version: std::sync::Mutex<HashMap<u64, usize>>,
    changed: Notify,
}

/// One poll in flight; its count goes when the poll ends, answered or cancelled.
struct PollInFlight<'a> {
    polls: &'a DirectoryPolls,
    version: u64,
}

impl Drop for PollInFlight<'_> {
    fn drop(&mut self) {
        let mut counts = self.polls.lock();
        let count = counts.get_mut(&self.version).expect("counted when the poll started");
        *count -= 1;
        if *count == 0 {
            counts.remove(&self.version);
        }
        drop(counts);
        self.polls.changed.notify_waiters();
    }
}

impl DirectoryPolls {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        self.in_flight_by_version.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn start(&self, version: u64) -> PollInFlight<'_> {
        *self.lock().entry(version).or_insert(0) += 1;
        self.changed.notify_waiters();
        PollInFlight { polls: self, version }
    }

    /// Every poll in flight, whatever version it names.
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().values().sum()
    }

    fn in_flight_naming(&self, version: u64) -> usize {
        self.lock().get(&version).copied().unwrap_or(0)
    }

    /// Waits until `followers` polls in flight name `version` (each follower polls again as
    /// soon as it installed a directory), `still_current` turns false (a newer change
    /// supersedes this one and waits for itself), or `wait_max` passes. True if they did.
    pub(crate) async fn wait_for_followers(
        &self,
        version: u64,
        followers: usize,
        wait_max: Duration,
        still_current: impl Fn() -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + wait_max;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.in_flight_naming(version) >= followers {
                return true;
            }
            if !still_current() {
                return false;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return false;
            }
        }
    }
}

type Failure = (Status, String);

/// The directory of `state`: every user, and the names of the tables that some grant other
/// than `*` matches. Its version is a digest of the rest, so two coordinators (an active one
/// and its successor) give the same version for the same content, and a server never
/// mistakes a changed directory for the one it has.
pub(crate) fn build_directory(state: &CoordinatorState) -> Result<UserDirectorySnapshot, String> {
    let users: Vec<UserRecord> = state.users.values().cloned().collect();
    let patterns: Vec<&str> = users
        .iter()
        .flat_map(|user| user.grants.iter())
        .map(|grant| grant.pattern.as_str())
        .filter(|pattern| UserDirectorySnapshot::pattern_needs_name(pattern))
        .collect();
    let mut tables: Vec<(TableId, String)> = state
        .tables
        .iter()
        .filter(|(name, _)| patterns.iter().any(|pattern| pattern_matches(pattern, name)))
        .map(|(name, table)| (table.table_id, name.clone()))
        .collect();
    tables.sort();
    let mut directory = UserDirectorySnapshot {
        version: 0,
        next_table_id: TableId(state.next_table_id),
        users,
        tables,
    };
    let mut encoded = BytesMut::new();
    let response = Response::GetUserDirectory { directory: Some(directory.clone()) };
    encode_response(&mut encoded, 0, Status::Ok, &response);
    if encoded.len() > USER_DIRECTORY_BYTES_MAX {
        return Err(format!(
            "the user directory would take {} bytes, over its limit of {USER_DIRECTORY_BYTES_MAX}",
            encoded.len()
        ));
    }
    let digest = Sha256::digest(&encoded);
    let version = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    // 0 means "none" to a server asking; a digest of 0 is as good as any other.
    directory.version = version.max(1);
    Ok(directory)
}

impl Inner {
    /// Hands `state`'s directory to the servers' long polls (and to this coordinator's own
    /// checks). Called, under the state lock, after every change to users or tables. A
    /// directory over its limit is not published (servers keep the previous one) and logged.
    pub(crate) fn publish_users(&self, state: &CoordinatorState) {
        match build_directory(state) {
            Ok(directory) => self.users.install(directory),
            Err(reason) => tracing::error!(%reason, "user directory not published"),
        }
    }

    /// Publishes `state`'s directory, releases the state, and waits (at most
    /// [`USER_DIRECTORY_PROPAGATION_WAIT_MAX`]) until every server that was following the
    /// directory holds it. For changes that take rights away (a password, a grant, a user): a
    /// server still checking the old directory would admit what the answer says is refused.
    async fn publish_users_and_wait(&self, state: tokio::sync::MutexGuard<'_, CoordinatorState>) {
        let followers = self.directory_polls.in_flight();
        self.publish_users(&state);
        drop(state);
        let version = self.users.snapshot().version;
        let reached = self
            .directory_polls
            .wait_for_followers(version, followers, USER_DIRECTORY_PROPAGATION_WAIT_MAX, || {
                self.users.snapshot().version == version
            })
            .await;
        if !reached {
            tracing::warn!(
                followers,
                holding = self.directory_polls.in_flight_naming(version),
                "not every server following the user directory confirmed the change in time"
            );
        }
    }

    /// Refuses a table whose name would grow the user directory past its limit (a grant's
    /// pattern names it): published or not, a directory that cannot be handed out would leave
    /// every server with an old one, where a deleted user still works.
    pub(crate) fn check_directory_with_table(
        &self,
        state: &CoordinatorState,
        name: &str,
        record: &TableRecord,
    ) -> Result<(), Failure> {
        if state.users.is_empty() {
            return Ok(());
        }
        let mut next = state.clone();
        next.tables.insert(name.to_string(), record.clone());
        next.next_table_id = record.table_id.0 + 1;
        build_directory(&next).map(|_| ()).map_err(|reason| {
            (Status::InvalidParameter, format!("table {name:?} is refused: {reason}"))
        })
    }

    /// SET_USER: creates `user` or replaces it (keeping its password if `user.credentials` is
    /// `None`).
    pub(crate) async fn set_user(&self, mut user: UserRecord) -> Result<Response, Failure> {
        user.validate().map_err(|reason| (Status::InvalidParameter, reason))?;
        let mut state = self.state.lock().await;
        let existing = state.users.get(&user.name);
        let created = existing.is_none();
        if created && state.users.len() >= USERS_MAX {
            return Err((
                Status::InvalidParameter,
                format!("the cluster is at its limit of {USERS_MAX} users"),
            ));
        }
        if user.credentials.is_none() {
            user.credentials = existing.and_then(|existing| existing.credentials.clone());
        }
        let mut next = state.clone();
        next.users.insert(user.name.clone(), user.clone());
        build_directory(&next).map_err(|reason| (Status::InvalidParameter, reason))?;
        self.persist(vec![put_user(&user)]).await?;
        tracing::info!(user = %user.name, created, enabled = user.enabled, "user set");
        state.users.insert(user.name.clone(), user);
        self.publish_users_and_wait(state).await;
        Ok(Response::SetUser { created })
    }

    /// DELETE_USER. The user's open connections are refused from their next request on (once
    /// the servers following the directory hold the change, which this waits for).
    pub(crate) async fn delete_user(&self, name: String) -> Result<Response, Failure> {
        let mut state = self.state.lock().await;
        if !state.users.contains_key(&name) {
            return Ok(Response::DeleteUser { existed: false });
        }
        self.persist(vec![MetaOperation::Delete { key: user_key(&name) }]).await?;
        tracing::info!(user = %name, "user deleted");
        state.users.remove(&name);
        self.publish_users_and_wait(state).await;
        Ok(Response::DeleteUser { existed: true })
    }

    /// LIST_USERS: every user, without keys.
    pub(crate) async fn list_users(&self) -> Result<Response, Failure> {
        let state = self.state.lock().await;
        Ok(Response::ListUsers { users: state.users.values().map(UserSummary::of).collect() })
    }

    /// GET_USER_DIRECTORY: the directory as soon as it differs from `known_version`, or
    /// "unchanged" after [`USER_DIRECTORY_POLL`].
    pub(crate) async fn user_directory(&self, known_version: u64) -> Result<Response, Failure> {
        let _in_flight = self.directory_polls.start(known_version);
        let directory = self.users.changed_from(known_version, USER_DIRECTORY_POLL).await;
        let changed = directory.version != known_version;
        Ok(Response::GetUserDirectory { directory: changed.then(|| (*directory).clone()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_types::Tier;
    use stratus_wire::{TableAccess, TableGrant};

    #[tokio::test(start_paused = true)]
    async fn a_change_waits_for_every_follower_to_poll_again_naming_it() {
        let polls = DirectoryPolls::default();
        let (first, second) = (polls.start(1), polls.start(1));
        let followers = polls.in_flight();
        assert_eq!(followers, 2);
        let wait = polls.wait_for_followers(2, followers, Duration::from_secs(2), || true);
        tokio::pin!(wait);
        // Both answered with version 2; one has polled again so far: still waiting.
        drop(first);
        drop(second);
        let _first_again = polls.start(2);
        assert!(tokio::time::timeout(Duration::from_millis(10), wait.as_mut()).await.is_err());
        let _second_again = polls.start(2);
        assert!(wait.await, "both followers hold version 2");
        assert_eq!(polls.in_flight(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_that_never_comes_back_holds_a_change_up_only_for_the_wait_max() {
        let polls = DirectoryPolls::default();
        drop(polls.start(1));
        let started = tokio::time::Instant::now();
        let reached = polls.wait_for_followers(2, 1, Duration::from_secs(2), || true).await;
        assert!(!reached);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        // A newer change supersedes a wait at once.
        let reached = polls.wait_for_followers(2, 1, Duration::from_secs(2), || false).await;
        assert!(!reached);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        assert_eq!(polls.in_flight(), 0, "a dropped poll leaves no count behind");
    }

    fn user(name: &str, pattern: &str) -> UserRecord {
        UserRecord {
            name: name.into(),
            enabled: true,
            credentials: None,
            grants: vec![TableGrant { pattern: pattern.into(), access: TableAccess::READ }],
        }
    }

    #[test]
    fn a_table_that_would_outgrow_the_directory_is_refused() {
        // One user whose pattern names every table, and enough tables with long names to
        // bring the directory to its limit.
        let mut state = CoordinatorState::default();
        state.users.insert("alice".into(), user("alice", "t*"));
        let name_bytes = 250;
        let entry_bytes = 8 + 2 + name_bytes;
        let tables = USER_DIRECTORY_BYTES_MAX / entry_bytes + 2;
        for id in 1..=tables as u64 {
            let name = format!("t{id:0>width$}", width = name_bytes - 1);
            state.tables.insert(
                name,
                TableRecord { table_id: TableId(id), tier: Tier::Memory, tablets: vec![] },
            );
        }
        state.next_table_id = tables as u64 + 1;
        assert!(build_directory(&state).is_err(), "the state is past the limit");
        let removed: Vec<String> = state.tables.keys().take(4).cloned().collect();
        for name in removed {
            state.tables.remove(&name);
        }
        build_directory(&state).expect("under the limit again");
        // Adding tables the pattern names fails once it would pass the limit again.
        let mut refused = false;
        for id in 0..128u64 {
            let table_id = TableId(state.next_table_id);
            let name = format!("t-new-{id:0>width$}", width = name_bytes - 6);
            let record = TableRecord { table_id, tier: Tier::Memory, tablets: vec![] };
            let mut next = state.clone();
            next.tables.insert(name.clone(), record.clone());
            next.next_table_id += 1;
            if build_directory(&next).is_err() {
                refused = true;
                break;
            }
            state = next;
        }
        assert!(refused, "no table was refused");
        // A table no pattern names other than `*` costs the directory nothing.
        let mut next = state.clone();
        next.tables.insert(
            "other".into(),
            TableRecord { table_id: TableId(u64::MAX - 1), tier: Tier::Memory, tablets: vec![] },
        );
        build_directory(&next).expect("unnamed tables do not count");
    }

    #[test]
    fn the_directory_names_only_tables_a_specific_pattern_matches_and_its_version_follows_content()
    {
        let mut state = CoordinatorState { next_table_id: 4, ..Default::default() };
        for (id, name) in [(1, "orders"), (2, "orders-archive"), (3, "users")] {
            state.tables.insert(
                name.into(),
                TableRecord { table_id: TableId(id), tier: Tier::Memory, tablets: vec![] },
            );
        }
        state.users.insert("alice".into(), user("alice", "orders*"));
        state.users.insert("root".into(), user("root", "*"));
        let directory = build_directory(&state).expect("small");
        assert_eq!(
            directory.tables,
            vec![(TableId(1), "orders".to_string()), (TableId(2), "orders-archive".to_string())]
        );
        assert_eq!(directory.next_table_id, TableId(4));
        assert_ne!(directory.version, 0);
        assert_eq!(build_directory(&state).expect("small").version, directory.version);
        state.users.insert("bob".into(), user("bob", "users"));
        let changed = build_directory(&state).expect("small");
        assert_ne!(changed.version, directory.version);
        assert!(changed.tables.contains(&(TableId(3), "users".to_string())));
        assert_eq!(changed.users.len(), 3);
        changed.validate().expect("valid");
    }
}
