//! `stratus tx`: one transaction from the shell. Operations come one per line on stdin:
//!
//! ```text
//! get TABLE KEY
//! set TABLE KEY VALUE
//! del TABLE KEY
//! incr TABLE KEY [DELTA]
//! ```
//!
//! Blank lines and lines starting with `#` are skipped. Keys are one word; a value is the rest
//! of its line. The operations run as one transaction (docs/design/transactions.md): reads see
//! the transaction's own writes, and nothing is applied unless everything is. After a commit,
//! each `get` prints `KEY<TAB>VALUE` (or `KEY<TAB>(nil)`) and each `incr` `KEY<TAB>N`, in
//! order, then `committed`; an abort prints `aborted: <reason>` and exits non-zero, and what
//! the transaction read is not printed (it may be a view that never was).

use std::collections::HashMap;
use std::io::{BufRead, Write};

use bytes::Bytes;
use stratus_client::{Client, TableId, Transaction, TxOutcome};
use stratus_types::limits::TRANSACTION_OBJECTS_MAX;

/// One parsed line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TxLine {
    Get { table: String, key: String },
    Set { table: String, key: String, value: String },
    Del { table: String, key: String },
    Incr { table: String, key: String, delta: i64 },
}

impl TxLine {
    fn table(&self) -> &str {
        match self {
            TxLine::Get { table, .. }
            | TxLine::Set { table, .. }
            | TxLine::Del { table, .. }
            | TxLine::Incr { table, .. } => table,
        }
    }
}

/// Parses `text` (line numbers from 1 in the errors); `None` for a blank or comment line.
pub(crate) fn parse_line(number: usize, text: &str) -> Result<Option<TxLine>, String> {
    let text = text.trim();
    if text.is_empty() || text.starts_with('#') {
        return Ok(None);
    }
    let mut words = text.splitn(4, char::is_whitespace).filter(|word| !word.is_empty());
    let (verb, table, key) = (words.next(), words.next(), words.next());
    let rest = words.next().map(str::trim);
    let usage = || format!("line {number}: expected `get|set|del|incr TABLE KEY ...`: {text}");
    let (Some(verb), Some(table), Some(key)) = (verb, table, key) else {
        return Err(usage());
    };
    let (table, key) = (table.to_string(), key.to_string());
    Ok(Some(match (verb.to_ascii_lowercase().as_str(), rest) {
        ("get", None) => TxLine::Get { table, key },
        ("del", None) => TxLine::Del { table, key },
        ("set", Some(value)) => TxLine::Set { table, key, value: value.to_string() },
        ("incr", None) => TxLine::Incr { table, key, delta: 1 },
        ("incr", Some(delta)) => {
            let delta =
                delta.parse().map_err(|_| format!("line {number}: not an integer: {delta}"))?;
            TxLine::Incr { table, key, delta }
        }
        _ => return Err(usage()),
    }))
}

/// Reads every line of `input`, at most [`TRANSACTION_OBJECTS_MAX`] operations.
pub(crate) fn read_lines(input: impl BufRead) -> Result<Vec<TxLine>, String> {
    let mut lines = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line.map_err(|error| format!("reading stdin: {error}"))?;
        if let Some(parsed) = parse_line(index + 1, &line)? {
            lines.push(parsed);
        }
        if lines.len() > TRANSACTION_OBJECTS_MAX {
            return Err(format!("more than {TRANSACTION_OBJECTS_MAX} operations"));
        }
    }
    if lines.is_empty() {
        return Err("no operation on stdin".to_string());
    }
    Ok(lines)
}

/// What one line printed after the commit.
enum Printed {
    Nothing,
    Value(String, Option<Bytes>),
    Integer(String, i64),
}

async fn apply(tx: &Transaction, table: TableId, line: &TxLine) -> Result<Printed, String> {
    let failed = |error: stratus_client::Error| error.to_string();
    Ok(match line {
        TxLine::Get { key, .. } => {
            Printed::Value(key.clone(), tx.read(table, key.as_bytes()).await.map_err(failed)?)
        }
        TxLine::Set { key, value, .. } => {
            tx.write(table, key.as_bytes(), value.as_bytes()).map_err(failed)?;
            Printed::Nothing
        }
        TxLine::Del { key, .. } => {
            tx.remove(table, key.as_bytes()).map_err(failed)?;
            Printed::Nothing
        }
        TxLine::Incr { key, delta, .. } => {
            let value = tx.increment(table, key.as_bytes(), *delta).await.map_err(failed)?;
            Printed::Integer(key.clone(), value)
        }
    })
}

/// Runs `lines` as one transaction and prints the outcome: `Err` for an abort or a failure.
pub(crate) async fn run(client: &Client, lines: &[TxLine]) -> Result<(), String> {
    let mut tables: HashMap<&str, TableId> = HashMap::new();
    for line in lines {
        if !tables.contains_key(line.table()) {
            let id = client
                .get_table_id(line.table())
                .await
                .map_err(|error| format!("table {}: {error}", line.table()))?;
            tables.insert(line.table(), id);
        }
    }
    let tx = client.transaction();
    let mut printed = Vec::with_capacity(lines.len());
    for line in lines {
        printed.push(apply(&tx, tables[line.table()], line).await?);
    }
    match tx.commit().await.map_err(|error| format!("outcome unknown: {error}"))? {
        TxOutcome::Committed => {}
        TxOutcome::Aborted(reason) => return Err(format!("aborted: {reason:?}")),
    }
    // The decision is on its way to the masters; the process ends right after, so it waits
    // for it (bounded) rather than leave the objects locked until the participants finish
    // the transaction themselves. Committed either way.
    client.settle_transactions(client.config().operation_timeout).await;
    let mut stdout = std::io::stdout().lock();
    for line in printed {
        let _ = match line {
            Printed::Nothing => Ok(()),
            Printed::Value(key, Some(value)) => writeln!(stdout, "{key}\t{}", value.escape_ascii()),
            Printed::Value(key, None) => writeln!(stdout, "{key}\t(nil)"),
            Printed::Integer(key, value) => writeln!(stdout, "{key}\t{value}"),
        };
    }
    let _ = writeln!(stdout, "committed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_into_operations_and_bad_ones_name_their_line() {
        let script = "# a transfer\n\nget bank alice\nset bank bob 1 2 3\nincr bank carol -5\n\
                      incr bank dave\ndel bank eve\n";
        let lines = read_lines(script.as_bytes()).unwrap();
        let (table, name) = (|| "bank".to_string(), |key: &str| key.to_string());
        assert_eq!(
            lines,
            vec![
                TxLine::Get { table: table(), key: name("alice") },
                TxLine::Set { table: table(), key: name("bob"), value: "1 2 3".into() },
                TxLine::Incr { table: table(), key: name("carol"), delta: -5 },
                TxLine::Incr { table: table(), key: name("dave"), delta: 1 },
                TxLine::Del { table: table(), key: name("eve") },
            ]
        );
        assert!(read_lines("get bank\n".as_bytes()).unwrap_err().starts_with("line 1:"));
        assert!(read_lines("get a b\nincr a b x\n".as_bytes()).unwrap_err().starts_with("line 2:"));
        assert!(read_lines("set a b\n".as_bytes()).is_err(), "a set needs a value");
        assert!(read_lines("get a b extra\n".as_bytes()).is_err());
        assert!(read_lines("frob a b\n".as_bytes()).is_err());
        assert!(read_lines("# nothing\n".as_bytes()).is_err());
    }
}
