//! Redis's ACL commands, in the subset that maps onto Stratus's named users
//! (docs/design/resp-acl.md).
//!
//! A Stratus user has one password, an enabled flag and grants of read, write and admin on
//! table-name patterns; Redis's key patterns become table patterns here (database n is the
//! table `redis-db-n`), and commands follow from the grants (a read needs read on the table, a
//! write write, FLUSHDB and creating a database's table admin), so command and channel rules
//! are accepted only in the forms that allow everything. The commands run with the session's
//! client: the cluster checks that the session is a cluster administrator (or the default
//! user) for USERS, LIST, GETUSER, SETUSER and DELUSER.

use bytes::Bytes;
use stratus_client::{TableAccess, TableGrant, UserSettings, UserSummary};

use crate::commands::{error, lowercase, Failure, Outcome};
use crate::gateway::{Gateway, Session};
use crate::value::Value;

/// One ACL SETUSER rule, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// `on`: the user may authenticate.
    On,
    /// `off`: it may not (its open connections are refused from their next command).
    Off,
    /// `>password`: its password (Stratus keeps one per user; this replaces it).
    Password(Vec<u8>),
    /// `reset`: off and no grants; the password is kept (Stratus has no user without one
    /// that can authenticate, and `nopass` is not supported).
    Reset,
    /// `~pattern`, `%R~pattern`, `%RW~pattern`, `%A~pattern`, `allkeys`: a grant (merged
    /// with a grant on the same pattern).
    Grant(TableGrant),
    /// `resetkeys`: no grants.
    ResetKeys,
    /// `+@all`, `allcommands`, `&*`, `allchannels`, `resetchannels`: nothing to do.
    NoOp,
}

/// What the refusal of an unsupported rule says Stratus supports.
const SUPPORTED_RULES: &str = "Stratus supports on, off, >password, reset, ~pattern, \
    %R~pattern, %W~pattern, %RW~pattern, %A~pattern (letters R, W, A in any order), allkeys, \
    resetkeys, and +@all, allcommands, &*, allchannels, resetchannels (accepted, nothing to \
    do); key patterns are table-name patterns (database n is table redis-db-n) and commands \
    follow from the table grants";

/// Parses one ACL SETUSER rule; the error is the whole error reply's text.
pub(crate) fn parse_rule(rule: &[u8]) -> Result<Rule, String> {
    let refuse = |why: &str| {
        let shown = String::from_utf8_lossy(&rule[..rule.len().min(128)]).into_owned();
        Err(format!("ERR Error in ACL SETUSER modifier '{shown}': {why}"))
    };
    if let Some(password) = rule.strip_prefix(b">") {
        return Ok(Rule::Password(password.to_vec()));
    }
    if let Some(pattern) = rule.strip_prefix(b"~") {
        return grant(pattern, TableAccess::READ.union(TableAccess::WRITE), rule);
    }
    if let Some(selector) = rule.strip_prefix(b"%") {
        let Some(tilde) = selector.iter().position(|&byte| byte == b'~') else {
            return refuse(&format!("a %<letters>~<pattern> rule needs a ~. {SUPPORTED_RULES}"));
        };
        let letters = std::str::from_utf8(&selector[..tilde]).unwrap_or("");
        let Some(access) = TableAccess::parse_letters(letters) else {
            return refuse(&format!(
                "the access of a %<letters>~<pattern> rule is one or more of R, W, A. \
                 {SUPPORTED_RULES}"
            ));
        };
        return grant(&selector[tilde + 1..], access, rule);
    }
    match lowercase(rule).as_str() {
        "on" => Ok(Rule::On),
        "off" => Ok(Rule::Off),
        "reset" => Ok(Rule::Reset),
        "allkeys" => Ok(Rule::Grant(TableGrant {
            pattern: "*".to_string(),
            access: TableAccess::READ.union(TableAccess::WRITE),
        })),
        "resetkeys" => Ok(Rule::ResetKeys),
        "+@all" | "allcommands" | "&*" | "allchannels" | "resetchannels" => Ok(Rule::NoOp),
        "nopass" | "resetpass" => refuse(&format!(
            "a Stratus user has exactly one password (give a new one with >password). \
             {SUPPORTED_RULES}"
        )),
        _ if rule.starts_with(b"<") || rule.starts_with(b"#") || rule.starts_with(b"!") => {
            refuse(&format!(
                "a Stratus user has exactly one password, set with >password (the cluster \
                 keeps only keys derived from it). {SUPPORTED_RULES}"
            ))
        }
        _ if rule.starts_with(b"+") || rule.starts_with(b"-") => {
            refuse(&format!("command rules other than +@all are not supported. {SUPPORTED_RULES}"))
        }
        _ if rule.starts_with(b"&") => refuse(&format!(
            "channel rules other than &* are not supported (the gateway has no pub/sub). \
             {SUPPORTED_RULES}"
        )),
        _ if rule.starts_with(b"(") => {
            refuse(&format!("selectors are not supported. {SUPPORTED_RULES}"))
        }
        _ => refuse(&format!("unknown rule. {SUPPORTED_RULES}")),
    }
}

/// A grant of `access` on the table pattern `pattern` (only `*` and `?` are special in a
/// table pattern: Redis's `[...]` classes and `\` escapes are refused rather than matched
/// literally).
fn grant(pattern: &[u8], access: TableAccess, rule: &[u8]) -> Result<Rule, String> {
    let shown = String::from_utf8_lossy(&rule[..rule.len().min(128)]).into_owned();
    let Ok(pattern) = std::str::from_utf8(pattern) else {
        return Err(format!(
            "ERR Error in ACL SETUSER modifier '{shown}': a table pattern is UTF-8 text"
        ));
    };
    if pattern.contains(['[', ']', '\\']) {
        return Err(format!(
            "ERR Error in ACL SETUSER modifier '{shown}': table patterns have only * and ? \
             (no [...] classes or \\ escapes)"
        ));
    }
    let grant = TableGrant { pattern: pattern.to_string(), access };
    grant
        .validate()
        .map_err(|why| format!("ERR Error in ACL SETUSER modifier '{shown}': {why}"))?;
    Ok(Rule::Grant(grant))
}

/// Applies `rules`, in order, to `settings` (a user's current settings, or a new user's: off,
/// no grants, no password).
pub(crate) fn apply_rules(settings: &mut UserSettings, rules: &[Rule]) {
    for rule in rules {
        match rule {
            Rule::On => settings.enabled = true,
            Rule::Off => settings.enabled = false,
            Rule::Password(password) => settings.password = Some(password.clone()),
            Rule::Reset => {
                settings.enabled = false;
                settings.grants.clear();
            }
            Rule::Grant(grant) => {
                match settings.grants.iter_mut().find(|kept| kept.pattern == grant.pattern) {
                    Some(kept) => kept.access = kept.access.union(grant.access),
                    None => settings.grants.push(grant.clone()),
                }
            }
            Rule::ResetKeys => settings.grants.clear(),
            Rule::NoOp => {}
        }
    }
}

/// A grant as ACL LIST shows it: `%RW~pattern`.
fn grant_rule(grant: &TableGrant) -> String {
    let mut letters = String::new();
    for (access, letter) in
        [(TableAccess::READ, 'R'), (TableAccess::WRITE, 'W'), (TableAccess::ADMIN, 'A')]
    {
        if grant.access.covers(access) {
            letters.push(letter);
        }
    }
    format!("%{letters}~{}", grant.pattern)
}

/// A user's ACL LIST line (never any password material).
pub(crate) fn describe(user: &UserSummary) -> String {
    let mut line = format!("user {} {}", user.name, if user.enabled { "on" } else { "off" });
    for grant in &user.grants {
        line.push(' ');
        line.push_str(&grant_rule(grant));
    }
    line.push_str(" &* +@all");
    line
}

/// The default user's ACL LIST line: it may do everything; its password is the cluster's
/// client password.
const DEFAULT_USER_LINE: &str = "user default on %RWA~* &* +@all";

impl Gateway {
    /// ACL WHOAMI | USERS | LIST | GETUSER | SETUSER | DELUSER | HELP.
    pub(crate) async fn acl(&self, session: &Session, arguments: &[Bytes]) -> Outcome {
        let subcommand = lowercase(&arguments[0]);
        let rest = &arguments[1..];
        let client = self.client_of(session);
        match (subcommand.as_str(), rest) {
            ("whoami", []) => Ok(Value::bulk(
                session.user.as_ref().map_or("default", |user| user.name.as_str()).as_bytes(),
            )),
            ("users", []) => {
                let mut names = vec!["default".to_string()];
                names.extend(client.list_users().await?.into_iter().map(|user| user.name));
                names.sort();
                Ok(Value::Array(names.iter().map(|name| Value::bulk(name.as_bytes())).collect()))
            }
            ("list", []) => {
                let mut lines = vec![DEFAULT_USER_LINE.to_string()];
                lines.extend(client.list_users().await?.iter().map(describe));
                lines.sort();
                Ok(Value::Array(lines.iter().map(|line| Value::bulk(line.as_bytes())).collect()))
            }
            ("getuser", [name]) => {
                let users = client.list_users().await?;
                let name = String::from_utf8_lossy(name);
                let (enabled, grants) = if name == "default" {
                    (true, vec![TableGrant { pattern: "*".to_string(), access: TableAccess::ALL }])
                } else {
                    match users.into_iter().find(|user| user.name == name) {
                        Some(user) => (user.enabled, user.grants),
                        None => return Ok(Value::Null),
                    }
                };
                let flag = if enabled { "on" } else { "off" };
                let keys: Vec<String> = grants.iter().map(grant_rule).collect();
                Ok(Value::Map(vec![
                    (Value::bulk(b"flags"), Value::Array(vec![Value::bulk(flag.as_bytes())])),
                    (Value::bulk(b"passwords"), Value::Array(Vec::new())),
                    (Value::bulk(b"commands"), Value::bulk(b"+@all")),
                    (Value::bulk(b"keys"), Value::bulk(keys.join(" ").as_bytes())),
                    (Value::bulk(b"channels"), Value::bulk(b"&*")),
                    (Value::bulk(b"selectors"), Value::Array(Vec::new())),
                ]))
            }
            ("setuser", [name, rules @ ..]) => self.set_user(session, name, rules).await,
            ("deluser", names) if !names.is_empty() => {
                if names.iter().any(|name| name.as_ref() == b"default") {
                    return Err(error("ERR The 'default' user cannot be removed"));
                }
                let mut deleted = 0;
                for name in names {
                    let name = String::from_utf8_lossy(name);
                    if client.delete_user(&name).await? {
                        deleted += 1;
                    }
                    self.lock_user_clients().forget(&name);
                }
                Ok(Value::Integer(deleted))
            }
            ("help", []) => Ok(Value::Array(
                [
                    "ACL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                    "WHOAMI, USERS, LIST, GETUSER <name>, SETUSER <name> [rule ...], \
                     DELUSER <name> [<name> ...], HELP.",
                    SUPPORTED_RULES,
                ]
                .iter()
                .map(|line| Value::simple(line))
                .collect(),
            )),
            ("whoami" | "users" | "list" | "getuser" | "setuser" | "deluser" | "help", _) => {
                Err(Failure::Reply(crate::commands::wrong_arity(&format!("acl|{subcommand}"))))
            }
            _ => Err(error(format!(
                "ERR ACL {} is not supported by Stratus (WHOAMI, USERS, LIST, GETUSER, SETUSER, \
                 DELUSER and HELP are)",
                String::from_utf8_lossy(&arguments[0][..arguments[0].len().min(64)])
                    .to_ascii_uppercase()
            ))),
        }
    }

    /// ACL SETUSER: the rules are all parsed first (one bad rule changes nothing), then
    /// applied to the user's current settings (read with LIST_USERS; a new user starts off,
    /// without grants or password) and written with SET_USER, which keeps the password unless
    /// `>password` gave one.
    async fn set_user(&self, session: &Session, name: &Bytes, rules: &[Bytes]) -> Outcome {
        if name.as_ref() == b"default" {
            return Err(error(
                "ERR the default user cannot be changed with ACL SETUSER in Stratus: its \
                 password is the cluster's client password file, and it may do everything",
            ));
        }
        let name = std::str::from_utf8(name)
            .map_err(|_| error("ERR a user name is ASCII letters, digits and _ . @ -"))?;
        stratus_client::validate_user_name(name).map_err(|why| error(format!("ERR {why}")))?;
        let rules = rules
            .iter()
            .map(|rule| parse_rule(rule))
            .collect::<Result<Vec<Rule>, String>>()
            .map_err(error)?;
        let client = self.client_of(session);
        let current = client.list_users().await?.into_iter().find(|user| user.name == name);
        let mut settings = match current {
            Some(user) => UserSettings {
                name: name.to_string(),
                password: None,
                enabled: user.enabled,
                grants: user.grants,
            },
            None => UserSettings {
                name: name.to_string(),
                password: None,
                enabled: false,
                grants: Vec::new(),
            },
        };
        apply_rules(&mut settings, &rules);
        client.set_user(settings).await?;
        self.lock_user_clients().forget(name);
        Ok(Value::ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw() -> TableAccess {
        TableAccess::READ.union(TableAccess::WRITE)
    }

    fn granted(pattern: &str, access: TableAccess) -> Rule {
        Rule::Grant(TableGrant { pattern: pattern.to_string(), access })
    }

    #[test]
    fn rules_parse_into_the_subset_stratus_supports() {
        let cases: Vec<(&str, Rule)> = vec![
            ("on", Rule::On),
            ("ON", Rule::On),
            ("off", Rule::Off),
            (">s3cret-password", Rule::Password(b"s3cret-password".to_vec())),
            ("reset", Rule::Reset),
            ("~orders", granted("orders", rw())),
            ("~redis-db-*", granted("redis-db-*", rw())),
            ("%R~log*", granted("log*", TableAccess::READ)),
            ("%W~sink", granted("sink", TableAccess::WRITE)),
            ("%RW~orders", granted("orders", rw())),
            ("%WR~orders", granted("orders", rw())),
            ("%rw~orders", granted("orders", rw())),
            ("%A~admin?", granted("admin?", TableAccess::ADMIN)),
            ("%RWA~*", granted("*", TableAccess::ALL)),
            ("%AWR~*", granted("*", TableAccess::ALL)),
            ("allkeys", granted("*", rw())),
            ("resetkeys", Rule::ResetKeys),
            ("+@all", Rule::NoOp),
            ("allcommands", Rule::NoOp),
            ("&*", Rule::NoOp),
            ("allchannels", Rule::NoOp),
            ("resetchannels", Rule::NoOp),
        ];
        for (rule, expected) in cases {
            assert_eq!(parse_rule(rule.as_bytes()), Ok(expected), "{rule}");
        }
    }

    #[test]
    fn other_rules_are_refused_naming_the_rule_and_the_subset() {
        let cases = [
            ("nopass", "exactly one password"),
            ("resetpass", "exactly one password"),
            ("<old-password", "exactly one password"),
            ("#5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8", "one password"),
            ("!5e88", "one password"),
            ("+get", "command rules"),
            ("-@all", "command rules"),
            ("nocommands", "unknown rule"),
            ("-@dangerous", "command rules"),
            ("&news*", "channel rules"),
            ("(~x +get)", "selectors"),
            ("%~x", "one or more of R, W, A"),
            ("%X~x", "one or more of R, W, A"),
            ("%RX~x", "one or more of R, W, A"),
            ("%RW", "needs a ~"),
            ("~", "a table pattern has 1 to"),
            ("~user:[ab]*", "only * and ?"),
            ("~a\\*", "only * and ?"),
            ("sanitize-payload", "unknown rule"),
            ("", "unknown rule"),
        ];
        for (rule, why) in cases {
            let refusal = parse_rule(rule.as_bytes()).expect_err(rule);
            assert!(
                refusal.starts_with(&format!("ERR Error in ACL SETUSER modifier '{rule}'")),
                "{rule}: {refusal}"
            );
            assert!(refusal.contains(why), "{rule}: {refusal}");
        }
        let long = format!("~{}", "x".repeat(stratus_types::limits::TABLE_PATTERN_BYTES_MAX + 1));
        assert!(parse_rule(long.as_bytes()).is_err());
    }

    #[test]
    fn rules_apply_in_order_to_the_current_settings() {
        let mut settings = UserSettings {
            name: "alice".to_string(),
            password: None,
            enabled: true,
            grants: vec![TableGrant { pattern: "orders".to_string(), access: TableAccess::READ }],
        };
        let rules: Vec<Rule> = ["%W~orders", "%R~log*", "+@all", "off", "on", ">new-password"]
            .iter()
            .map(|rule| parse_rule(rule.as_bytes()).unwrap())
            .collect();
        apply_rules(&mut settings, &rules);
        assert!(settings.enabled);
        assert_eq!(settings.password.as_deref(), Some(&b"new-password"[..]));
        assert_eq!(
            settings.grants,
            vec![
                TableGrant { pattern: "orders".to_string(), access: rw() },
                TableGrant { pattern: "log*".to_string(), access: TableAccess::READ },
            ]
        );
        let summary = UserSummary {
            name: "alice".to_string(),
            enabled: true,
            has_password: true,
            grants: settings.grants.clone(),
        };
        assert_eq!(describe(&summary), "user alice on %RW~orders %R~log* &* +@all");
        apply_rules(&mut settings, &[Rule::Reset]);
        assert!(!settings.enabled && settings.grants.is_empty());
        assert_eq!(settings.password.as_deref(), Some(&b"new-password"[..]), "reset keeps it");
        apply_rules(&mut settings, &[parse_rule(b"allkeys").unwrap(), Rule::ResetKeys]);
        assert!(settings.grants.is_empty());
    }
}

#[cfg(test)]
mod offline_tests {
    use crate::gateway::{GatewayConfig, RespPassword, Session};
    use crate::test_support::{call, offline_gateway_with};
    use crate::value::Value;

    fn error_text(value: Value) -> String {
        match value {
            Value::Error(text) => text,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn what_the_gateway_decides_alone() {
        let gateway = offline_gateway_with(GatewayConfig {
            password: Some(RespPassword(b"s3cret-password".to_vec())),
            ..GatewayConfig::default()
        });
        let mut session = Session::new(1);
        assert!(error_text(call(&gateway, &mut session, &["ACL", "WHOAMI"]).await)
            .starts_with("NOAUTH"));
        // No user factory: a named user does not exist here, and the attempt counts.
        let text = error_text(call(&gateway, &mut session, &["AUTH", "alice", "password1"]).await);
        assert!(text.starts_with("WRONGPASS"), "{text}");
        assert_eq!(gateway.authentications_failed.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(call(&gateway, &mut session, &["AUTH", "s3cret-password"]).await, Value::ok());
        assert_eq!(call(&gateway, &mut session, &["ACL", "WHOAMI"]).await, Value::bulk(b"default"));
        let text =
            error_text(call(&gateway, &mut session, &["ACL", "SETUSER", "default", "on"]).await);
        assert!(text.contains("default user cannot be changed"), "{text}");
        // Rules are checked before the cluster is asked anything.
        let text = error_text(
            call(&gateway, &mut session, &["ACL", "SETUSER", "alice", "on", "+get"]).await,
        );
        assert!(text.starts_with("ERR Error in ACL SETUSER modifier '+get'"), "{text}");
        let text =
            error_text(call(&gateway, &mut session, &["ACL", "SETUSER", "no spaces", "on"]).await);
        assert!(text.contains("only ASCII letters"), "{text}");
        let text =
            error_text(call(&gateway, &mut session, &["ACL", "DELUSER", "alice", "default"]).await);
        assert!(text.contains("'default' user cannot be removed"), "{text}");
        let text = error_text(call(&gateway, &mut session, &["ACL", "LOG"]).await);
        assert!(text.contains("not supported by Stratus"), "{text}");
        let text = error_text(call(&gateway, &mut session, &["ACL", "WHOAMI", "x"]).await);
        assert!(text.contains("wrong number of arguments"), "{text}");
        let text = error_text(call(&gateway, &mut session, &["ACL", "DELUSER"]).await);
        assert!(text.contains("wrong number of arguments"), "{text}");
        // Inside MULTI, ACL is refused (it is not a transaction's operation).
        assert_eq!(call(&gateway, &mut session, &["MULTI"]).await, Value::ok());
        let text = error_text(call(&gateway, &mut session, &["ACL", "WHOAMI"]).await);
        assert!(text.contains("not supported inside MULTI"), "{text}");
    }
}
