//! Reading the logs of the processes of a benchmark's local cluster: when the coordinator
//! declared a server crashed and how long it says the recovery took (the timestamps and fields
//! of its tracing lines), and what to show of the logs after a failure.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use stratus_types::ServerId;

/// Lines of a log shown after a failure.
const LOG_LINES_SHOWN: usize = 40;

/// When the coordinator declared `server` crashed: the timestamp of its "server declared
/// crashed" log line for that server.
pub fn crash_declaration_time(log: &str, server: ServerId) -> Option<SystemTime> {
    let line = find_log_line(log, "server declared crashed", "server_id", server)?;
    parse_utc_timestamp(line.split_whitespace().next()?)
}

/// How long the coordinator's recovery of `server` took by its own account (its "recovery
/// finished" line).
pub fn recovery_finished_elapsed(log: &str, server: ServerId) -> Option<Duration> {
    let line = find_log_line(log, "recovery finished", "crashed", server)?;
    let milliseconds = field_value(&line, "elapsed_ms")?.parse().ok()?;
    Some(Duration::from_millis(milliseconds))
}

/// What one recovery master says of the partition it recovered (its "partition replayed and
/// durable" line): the replica bytes it read and how long each phase took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionRecovered {
    /// Objects it replayed into its store.
    pub objects: u64,
    /// Bytes of replicas read from the backups.
    pub replica_bytes_read: u64,
    /// From the start until every replica of the partition was read.
    pub read: Duration,
    /// The replay into the side log.
    pub replay: Duration,
    /// From the end of the replay until the replayed objects were durable.
    pub durable: Duration,
}

/// The partitions of `crashed`'s recovery this master's `log` recovered.
pub fn partitions_recovered(log: &str, crashed: ServerId) -> Vec<PartitionRecovered> {
    let crashed = crashed.to_string();
    log.lines()
        .map(strip_terminal_escapes)
        .filter(|line| {
            line.contains("partition replayed and durable")
                && field_value(line, "crashed_master") == Some(crashed.as_str())
        })
        .filter_map(|line| {
            let number = |name: &str| field_value(&line, name)?.parse::<u64>().ok();
            Some(PartitionRecovered {
                objects: number("objects")?,
                replica_bytes_read: number("replica_bytes_read")?,
                read: Duration::from_millis(number("read_ms")?),
                replay: Duration::from_millis(number("replay_ms")?),
                durable: Duration::from_millis(number("durable_ms")?),
            })
        })
        .collect()
}

/// The objects the coordinator expected each recovery master of `crashed` to replay, from the
/// "recovery partition planned" lines after its last "recovering" line for `crashed` (the
/// last attempt). `None` when it planned without table statistics, or logged no plan.
pub fn objects_expected(log: &str, crashed: ServerId) -> Option<Vec<u64>> {
    let crashed = crashed.to_string();
    let lines: Vec<String> = log
        .lines()
        .map(strip_terminal_escapes)
        .filter(|line| field_value(line, "crashed") == Some(crashed.as_str()))
        .collect();
    let last_attempt = lines.iter().rposition(|line| line.contains(" recovering "))?;
    lines[last_attempt + 1..]
        .iter()
        .filter(|line| line.contains("recovery partition planned"))
        .map(|line| field_value(line, "expected_objects")?.parse().ok())
        .collect::<Option<Vec<u64>>>()
        .filter(|expected| !expected.is_empty())
}

/// The first line of `log` (colour codes removed) with `message` whose field `field` is
/// `server`.
fn find_log_line(log: &str, message: &str, field: &str, server: ServerId) -> Option<String> {
    let server = server.to_string();
    log.lines()
        .map(strip_terminal_escapes)
        .find(|line| line.contains(message) && field_value(line, field) == Some(server.as_str()))
}

/// The value of a `name=value` field of a log line.
fn field_value<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
}

/// `text` without ANSI escape sequences (ESC '[' parameters, then a final byte).
fn strip_terminal_escapes(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut characters = text.chars();
    while let Some(character) = characters.next() {
        if character == '\u{1b}' {
            if characters.next() == Some('[') {
                for inner in characters.by_ref() {
                    if ('@'..='~').contains(&inner) {
                        break;
                    }
                }
            }
        } else {
            plain.push(character);
        }
    }
    plain
}

/// Parses an RFC 3339 UTC timestamp as the log writes it: `2026-11-23T10:59:54.260587Z`.
fn parse_utc_timestamp(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date_parts = date.splitn(3, '-');
    let year: i64 = date_parts.next()?.parse().ok()?;
    let month: u32 = date_parts.next()?.parse().ok()?;
    let day: u32 = date_parts.next()?.parse().ok()?;
    let (clock, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut clock_parts = clock.splitn(3, ':');
    let hour: u64 = clock_parts.next()?.parse().ok()?;
    let minute: u64 = clock_parts.next()?.parse().ok()?;
    let second: u64 = clock_parts.next()?.parse().ok()?;
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let nanoseconds = if fraction.is_empty() {
        0
    } else {
        if fraction.len() > 9 || !fraction.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        fraction.parse::<u32>().ok()? * 10u32.pow(9 - fraction.len() as u32)
    };
    let days = u64::try_from(days_since_unix_epoch(year, month, day)).ok()?;
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    Some(SystemTime::UNIX_EPOCH + Duration::new(seconds, nanoseconds))
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days_since_unix_epoch(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// After a failure, the coordinator's log and the warnings of the servers' logs, their first
/// and last lines (how the trouble began and how it stood), so the cause can be seen even when
/// the directory is removed.
pub fn print_log_tails(logs: &Path) {
    let Ok(entries) = std::fs::read_dir(logs) else { return };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
    paths.sort();
    for path in paths {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let is_coordinator = path.file_name().is_some_and(|name| name == "coordinator.log");
        let lines: Vec<&str> = text
            .lines()
            .filter(|line| is_coordinator || line.contains("WARN") || line.contains("ERROR"))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let what = if is_coordinator { "" } else { ", warnings only" };
        eprintln!("--- {} ({} lines{what}) ---", path.display(), lines.len());
        for line in shown_lines(&lines, LOG_LINES_SHOWN) {
            eprintln!("{line}");
        }
    }
}

/// At most `limit` of `lines`: all of them, or the first and last halves with a line saying
/// how many were left out between them.
fn shown_lines(lines: &[&str], limit: usize) -> Vec<String> {
    if lines.len() <= limit {
        return lines.iter().map(|line| line.to_string()).collect();
    }
    let half = limit / 2;
    let mut shown: Vec<String> = lines[..half].iter().map(|line| line.to_string()).collect();
    shown.push(format!("... {} lines left out ...", lines.len() - 2 * half));
    shown.extend(lines[lines.len() - half..].iter().map(|line| line.to_string()));
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_logs_show_their_beginning_and_end() {
        let lines: Vec<String> = (0..10).map(|line| line.to_string()).collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert_eq!(shown_lines(&lines[..3], 4), vec!["0", "1", "2"]);
        assert_eq!(shown_lines(&lines, 4), vec!["0", "1", "... 6 lines left out ...", "8", "9"]);
    }

    #[test]
    fn the_partitions_a_master_recovered_are_found() {
        let log = "\
2026-11-26T09:50:29.398Z  INFO stratus_master::recovery: recovering a partition crashed_master=1 tablets=1 segments=34
2026-11-26T09:50:30.588Z  INFO stratus_master::recovery: partition replayed and durable \
crashed_master=1 segments=34 objects=134754 replica_bytes_read=139843339 read_ms=375 replay_ms=280 \
durable_ms=212
2026-11-26T09:51:30.588Z  INFO stratus_master::recovery: partition replayed and durable \
crashed_master=4 segments=3 objects=1 replica_bytes_read=1 read_ms=1 replay_ms=1 durable_ms=1
";
        assert_eq!(
            partitions_recovered(log, ServerId(1)),
            vec![PartitionRecovered {
                objects: 134_754,
                replica_bytes_read: 139_843_339,
                read: Duration::from_millis(375),
                replay: Duration::from_millis(280),
                durable: Duration::from_millis(212),
            }]
        );
        assert!(partitions_recovered(log, ServerId(2)).is_empty());
    }

    #[test]
    fn the_last_attempt_s_expectations_are_found() {
        let log = "\
2026-11-26T09:50:29.1Z  INFO stratus_coordinator::recovery: recovering crashed=1 tablets=1 segments=3 recovery_masters=2 sized_by=\"table stats\"
2026-11-26T09:50:29.2Z  INFO stratus_coordinator::recovery: recovery partition planned crashed=1 recovery_master=2 parts=1 expected_bytes=9 expected_objects=5
2026-11-26T09:50:29.3Z  INFO stratus_coordinator::recovery: recovering crashed=1 tablets=1 segments=3 recovery_masters=2 sized_by=\"table stats\"
2026-11-26T09:50:29.4Z  INFO stratus_coordinator::recovery: recovery partition planned crashed=1 recovery_master=2 parts=1 expected_bytes=9 expected_objects=7
2026-11-26T09:50:29.4Z  INFO stratus_coordinator::recovery: recovery partition planned crashed=3 recovery_master=2 parts=1 expected_bytes=9 expected_objects=1
2026-11-26T09:50:29.5Z  INFO stratus_coordinator::recovery: recovery partition planned crashed=1 recovery_master=4 parts=2 expected_bytes=9 expected_objects=8
2026-11-26T09:50:30.1Z  INFO stratus_coordinator::recovery: recovering crashed=5 tablets=1 segments=3 recovery_masters=1 sized_by=\"hash span\"
2026-11-26T09:50:30.2Z  INFO stratus_coordinator::recovery: recovery partition planned crashed=5 recovery_master=2 parts=1
";
        assert_eq!(objects_expected(log, ServerId(1)), Some(vec![7, 8]));
        assert_eq!(objects_expected(log, ServerId(5)), None);
        assert_eq!(objects_expected(log, ServerId(9)), None);
    }

    #[test]
    fn timestamps_parse_as_utc() {
        let parsed = parse_utc_timestamp("2026-11-23T10:59:54.260587Z").unwrap();
        assert_eq!(parsed, SystemTime::UNIX_EPOCH + Duration::new(1_795_431_594, 260_587_000));
        let leap_day = parse_utc_timestamp("2000-02-29T23:59:59Z").unwrap();
        assert_eq!(leap_day, SystemTime::UNIX_EPOCH + Duration::from_secs(951_868_799));
        assert_eq!(parse_utc_timestamp("1970-01-01T00:00:00Z"), Some(SystemTime::UNIX_EPOCH));
        for bad in ["2026-11-23 10:59:54Z", "2026-13-01T00:00:00Z", "2026-11-23T10:59:54", "x"] {
            assert_eq!(parse_utc_timestamp(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_crash_declaration_of_the_right_server_is_found_with_or_without_colour() {
        let log = "\
2026-11-23T10:59:50.000001Z  INFO stratus_coordinator::service: server enlisted server_id=3 address=127.0.0.1:1
2026-11-23T10:59:54.100000Z  WARN stratus_coordinator::recovery: server declared crashed server_id=13 address=127.0.0.1:2 why=\"missed pings\"
\u{1b}[2m2026-11-23T10:59:54.260587Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m \u{1b}[2mstratus_coordinator::recovery\u{1b}[0m\u{1b}[2m:\u{1b}[0m server declared crashed \u{1b}[3mserver_id\u{1b}[0m\u{1b}[2m=\u{1b}[0m3 \u{1b}[3maddress\u{1b}[0m\u{1b}[2m=\u{1b}[0m127.0.0.1:1
2026-11-23T10:59:55.000000Z  INFO stratus_coordinator::recovery: recovery finished crashed=3 attempt=1 elapsed_ms=734
";
        assert_eq!(
            crash_declaration_time(log, ServerId(3)),
            Some(SystemTime::UNIX_EPOCH + Duration::new(1_795_431_594, 260_587_000))
        );
        assert_eq!(crash_declaration_time(log, ServerId(4)), None);
        assert_eq!(recovery_finished_elapsed(log, ServerId(3)), Some(Duration::from_millis(734)));
        assert_eq!(recovery_finished_elapsed(log, ServerId(13)), None);
    }
}
