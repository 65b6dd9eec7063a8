//! `stratus user ...` and `stratus whoami`: managing named users from the command line
//! (docs/design/security.md, "Users").

use std::path::PathBuf;

use clap::{Args, Subcommand};
use stratus_client::{Client, Identity, TableAccess, TableGrant, UserSettings};

/// `stratus user ...` (a cluster administrator's commands, or the client password's).
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user, or change what is given of its password, grants and enabled flag (the
    /// rest is kept).
    Set(SetUserArguments),
    /// Delete a user; its open connections are refused from their next request on.
    Delete {
        /// The user's name.
        name: String,
    },
    /// List every user: name, enabled, whether it has a password, grants.
    List,
}

/// `stratus user set`.
#[derive(Debug, Args)]
pub struct SetUserArguments {
    /// The user's name (ASCII letters, digits and _ . @ -; at most 64 bytes).
    pub name: String,
    /// File holding the user's new password (at least 8 bytes). Without it (or
    /// --generate-password) the user keeps its password.
    #[arg(long, conflicts_with = "generate_password")]
    pub new_password_file: Option<PathBuf>,
    /// Give the user a new random password and print it (once: it is not kept anywhere).
    #[arg(long)]
    pub generate_password: bool,
    /// What the user may do: TABLE-PATTERN=ACCESS, ACCESS letters from r (read), w (write),
    /// a (admin); `*` in a pattern matches any run of characters, `?` one. Repeat for each
    /// grant; given, they replace the user's grants (without, an existing user keeps its
    /// own). `*=rwa` makes a cluster administrator.
    #[arg(long = "grant", value_parser = parse_grant, conflicts_with = "no_grants")]
    pub grants: Vec<TableGrant>,
    /// Take every grant away.
    #[arg(long)]
    pub no_grants: bool,
    /// Disable the user: it cannot authenticate, and its open connections are refused.
    #[arg(long, conflicts_with = "enabled")]
    pub disabled: bool,
    /// Enable the user again (a new user is enabled unless --disabled; an existing one keeps
    /// its state unless one of the two is given).
    #[arg(long)]
    pub enabled: bool,
}

/// Parses `PATTERN=rwa`.
pub fn parse_grant(text: &str) -> Result<TableGrant, String> {
    let (pattern, letters) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?}: a grant is TABLE-PATTERN=ACCESS, such as orders=rw"))?;
    let access = TableAccess::parse_letters(letters)
        .ok_or_else(|| format!("{letters:?}: access is letters among r, w, a"))?;
    let grant = TableGrant { pattern: pattern.to_string(), access };
    grant.validate()?;
    Ok(grant)
}

/// 24 random characters from a 62-letter alphabet: about 143 bits.
fn generated_password() -> String {
    use stratus_env::Entropy;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let entropy = stratus_env::OsEntropy;
    (0..24).map(|_| char::from(ALPHABET[entropy.below(ALPHABET.len() as u64) as usize])).collect()
}

/// One grant list as text: `orders=rw, logs*=r`, or `(none)`.
fn grants_text(grants: &[TableGrant]) -> String {
    if grants.is_empty() {
        return "(none)".to_string();
    }
    grants.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Runs a `stratus user` command.
pub async fn run(client: &Client, command: UserCommand) -> Result<(), String> {
    match command {
        UserCommand::Set(arguments) => {
            let generated = arguments.generate_password.then(generated_password);
            let password = match (&arguments.new_password_file, &generated) {
                (Some(path), _) => Some(
                    stratus_rpc::membership::read_secret_file(path)
                        .map_err(|error| format!("--new-password-file: {error}"))?,
                ),
                (None, Some(password)) => Some(password.as_bytes().to_vec()),
                (None, None) => None,
            };
            // What is not given is kept: a password reset must not re-enable a disabled user
            // or take its grants away.
            let users = client.list_users().await.map_err(|error| error.to_string())?;
            let existing = users.into_iter().find(|user| user.name == arguments.name);
            let grants = match (&existing, arguments.grants.is_empty(), arguments.no_grants) {
                (_, _, true) => Vec::new(),
                (Some(existing), true, false) => existing.grants.clone(),
                _ => arguments.grants,
            };
            let enabled = match (&existing, arguments.enabled, arguments.disabled) {
                (_, true, _) => true,
                (_, _, true) => false,
                (Some(existing), false, false) => existing.enabled,
                (None, false, false) => true,
            };
            let settings = UserSettings { name: arguments.name.clone(), password, enabled, grants };
            let created = client.set_user(settings).await.map_err(|error| error.to_string())?;
            let verb = if created { "created" } else { "updated" };
            println!("{verb} user {}", arguments.name);
            if let Some(password) = generated {
                println!("password: {password}");
            }
        }
        UserCommand::Delete { name } => {
            let existed = client.delete_user(&name).await.map_err(|error| error.to_string())?;
            if existed {
                println!("deleted user {name}");
            } else {
                return Err(format!("no user named {name:?}"));
            }
        }
        UserCommand::List => {
            let users = client.list_users().await.map_err(|error| error.to_string())?;
            println!("{:<24} {:<8} {:<8} GRANTS", "USER", "ENABLED", "PASSWORD");
            for user in users {
                println!(
                    "{:<24} {:<8} {:<8} {}",
                    user.name,
                    if user.enabled { "yes" } else { "no" },
                    if user.has_password { "set" } else { "none" },
                    grants_text(&user.grants)
                );
            }
        }
    }
    Ok(())
}

/// Runs `stratus whoami`.
pub async fn who_am_i(client: &Client) -> Result<(), String> {
    let identity = client.who_am_i().await.map_err(|error| error.to_string())?;
    match identity {
        Identity::Open => println!("anonymous (the cluster runs without a cluster secret)"),
        Identity::Member => println!("a cluster member"),
        Identity::Default => println!("default (the client password: every table)"),
        Identity::Anonymous => println!("anonymous (the cluster requires no password)"),
        Identity::User { name, grants } => println!("{name}: {}", grants_text(&grants)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_parse_from_the_command_line() {
        let grant = parse_grant("orders-*=rw").expect("valid");
        assert_eq!(grant.pattern, "orders-*");
        assert_eq!(grant.access, TableAccess::READ.union(TableAccess::WRITE));
        assert_eq!(parse_grant("a=b=r").expect("valid").pattern, "a=b");
        assert!(parse_grant("orders").is_err());
        assert!(parse_grant("orders=x").is_err());
        assert!(parse_grant("=r").is_err());
        assert_eq!(generated_password().len(), 24);
    }
}
