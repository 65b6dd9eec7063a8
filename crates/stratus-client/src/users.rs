//! Managing named users (a cluster administrator's calls) and asking who this client is.
//! docs/design/security.md, "Users".

use stratus_wire::{
    Identity, Request, Response, ResponseBody, Status, TableGrant, UserRecord, UserSummary,
};

use crate::client::{unexpected, Client};
use crate::error::{Error, Result};

/// What [`Client::set_user`] sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserSettings {
    /// The user's name.
    pub name: String,
    /// A new password, or `None` to keep the user's (a new user without one cannot
    /// authenticate until it is given one).
    pub password: Option<Vec<u8>>,
    /// Whether the user may authenticate.
    pub enabled: bool,
    /// What it may do (replacing its grants).
    pub grants: Vec<TableGrant>,
}

impl Client {
    /// Creates the user, or replaces its grants, enabled flag and (if given) password; true if
    /// it did not exist. The password is turned into stored keys here (one Argon2id), so it
    /// never leaves this process. Needs a cluster administrator (or the client password).
    pub async fn set_user(&self, settings: UserSettings) -> Result<bool> {
        let credentials = match settings.password {
            Some(password) => {
                let derived =
                    stratus_env::run_blocking(move || stratus_rpc::new_user_credentials(&password))
                        .await
                        .map_err(|error| Error::new(Status::InternalError, error))?
                        .map_err(|reason| Error::new(Status::InvalidParameter, reason))?;
                Some(derived)
            }
            None => None,
        };
        let user = UserRecord {
            name: settings.name,
            enabled: settings.enabled,
            credentials,
            grants: settings.grants,
        };
        user.validate().map_err(|reason| Error::new(Status::InvalidParameter, reason))?;
        match self.inner.coordinator_call(&Request::SetUser { user }).await? {
            Response::SetUser { created } => Ok(created),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }

    /// Deletes the user; true if it existed. Its open connections are refused from their next
    /// request on.
    pub async fn delete_user(&self, name: &str) -> Result<bool> {
        let request = Request::DeleteUser { name: name.to_string() };
        match self.inner.coordinator_call(&request).await? {
            Response::DeleteUser { existed } => Ok(existed),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }

    /// Every user, without keys.
    pub async fn list_users(&self) -> Result<Vec<UserSummary>> {
        match self.inner.coordinator_call(&Request::ListUsers).await? {
            Response::ListUsers { users } => Ok(users),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }

    /// Who the cluster takes this client for (asked of the coordinator).
    pub async fn who_am_i(&self) -> Result<Identity> {
        match self.inner.coordinator_call(&Request::WhoAmI).await? {
            Response::WhoAmI { identity } => Ok(identity),
            other => Err(unexpected(&ResponseBody::Operation(other))),
        }
    }
}
