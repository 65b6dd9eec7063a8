//! Unit tests of the codecs: every RESP type, requests split at every byte, malformed input,
//! and property tests.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use crate::request::{Parsed, RequestLimits, RequestParser};
use crate::value::{parse_value, Protocol, Value};

fn command(arguments: &[&[u8]]) -> Parsed {
    Parsed::Command(arguments.iter().map(|argument| Bytes::copy_from_slice(argument)).collect())
}

fn encode_command(command: &Parsed) -> Vec<u8> {
    let Parsed::Command(arguments) = command else { panic!("only commands encode") };
    let value = Value::Array(arguments.iter().cloned().map(Value::BulkString).collect());
    value.to_bytes(Protocol::Resp2).to_vec()
}

/// Feeds `input` in pieces cut at `cuts` and collects every command and the final outcome.
fn parse_in_pieces(
    input: &[u8],
    cuts: &[usize],
    limits: RequestLimits,
) -> (Vec<Parsed>, Result<(), String>) {
    let mut parser = RequestParser::new(limits);
    let mut buffer = BytesMut::new();
    let mut commands = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&input.len())) {
        buffer.extend_from_slice(&input[start..end]);
        start = end;
        loop {
            match parser.next_command(&mut buffer) {
                Ok(Some(parsed)) => commands.push(parsed),
                Ok(None) => break,
                Err(error) => return (commands, Err(error.0)),
            }
        }
    }
    (commands, Ok(()))
}

fn parse_all(input: &[u8]) -> (Vec<Parsed>, Result<(), String>) {
    parse_in_pieces(input, &[], RequestLimits::default())
}

#[test]
fn parses_a_pipeline_of_commands_split_at_every_byte() {
    let expected = vec![
        command(&[b"SET", b"key", b"va\r\nlue\0"]),
        command(&[b"GET", b"key"]),
        command(&[b"PING"]),
        command(&[b"SET", b"empty", b""]),
    ];
    let mut input = Vec::new();
    for arguments in &expected[..2] {
        input.extend(encode_command(arguments));
    }
    input.extend_from_slice(b"PING\r\n");
    input.extend(encode_command(&expected[3]));
    for cut in 0..=input.len() {
        let (commands, outcome) = parse_in_pieces(&input, &[cut], RequestLimits::default());
        assert_eq!(outcome, Ok(()), "cut at {cut}");
        assert_eq!(commands, expected, "cut at {cut}");
    }
    // One byte at a time.
    let cuts: Vec<usize> = (1..input.len()).collect();
    let (commands, outcome) = parse_in_pieces(&input, &cuts, RequestLimits::default());
    assert_eq!(outcome, Ok(()));
    assert_eq!(commands, expected);
}

#[test]
fn parses_inline_commands_and_skips_empty_ones() {
    let (commands, outcome) = parse_all(b"PING\r\n\r\n  set  a\tb \n*0\r\n*-1\r\nGET a\r\n");
    assert_eq!(outcome, Ok(()));
    assert_eq!(
        commands,
        vec![command(&[b"PING"]), command(&[b"set", b"a", b"b"]), command(&[b"GET", b"a"])]
    );
}

#[test]
fn malformed_requests_are_protocol_errors() {
    let cases: &[(&[u8], &str)] = &[
        (b"*x\r\n", "Protocol error: invalid multibulk length"),
        (b"*99999999999\r\n", "Protocol error: invalid multibulk length"),
        (b"*1\r\n:1\r\n", "Protocol error: expected '$', got ':'"),
        (b"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"),
        (b"*1\r\n$abc\r\n", "Protocol error: invalid bulk length"),
        (b"*1\r\n$+3\r\nabc\r\n", "Protocol error: invalid bulk length"),
        (b"*1\r\n$3\r\nabcXY", "Protocol error: bulk string not followed by CRLF"),
        (b"*1\r\n$1111111111111111111111111111111111111111", "Protocol error: invalid bulk length"),
        (
            b"*11111111111111111111111111111111111111111111",
            "Protocol error: too big mbulk count string",
        ),
    ];
    for (input, expected) in cases {
        let (_, outcome) = parse_all(input);
        assert_eq!(
            outcome,
            Err(expected.to_string()),
            "input {:?}",
            input.escape_ascii().to_string()
        );
    }
}

#[test]
fn limits_are_enforced_before_bytes_arrive() {
    let limits = RequestLimits {
        argument_bytes_max: 10,
        arguments_max: 3,
        command_bytes_max: 15,
        inline_bytes_max: 8,
        refused_command_bytes_max: 40,
    };
    // A refused argument is dropped, not kept: the parser waits for no more than its header.
    let (commands, outcome) = parse_in_pieces(b"*1\r\n$11\r\n", &[], limits);
    assert_eq!((commands, outcome), (vec![], Ok(())));
    let (_, outcome) = parse_in_pieces(b"*4\r\n", &[], limits);
    assert_eq!(outcome, Err("Protocol error: invalid multibulk length".to_string()));
    // Past what a refused command may drop, the connection ends.
    let (_, outcome) = parse_in_pieces(b"*1\r\n$41\r\n", &[], limits);
    assert_eq!(outcome, Err("Protocol error: invalid bulk length".to_string()));
    let (_, outcome) = parse_in_pieces(b"GET abcdefgh", &[], limits);
    assert_eq!(outcome, Err("Protocol error: too big inline request".to_string()));
    let (commands, outcome) = parse_in_pieces(b"GET abc\n", &[], limits);
    assert_eq!((commands, outcome), (vec![command(&[b"GET", b"abc"])], Ok(())));
}

/// A command over a limit is read to its end and refused, and the connection goes on: what
/// `redis-cli -x SET big < file` needs to see its error instead of a reset connection.
#[test]
fn an_oversized_command_is_dropped_and_refused_and_the_next_one_parses() {
    let limits = RequestLimits {
        argument_bytes_max: 10,
        arguments_max: 4,
        command_bytes_max: 15,
        inline_bytes_max: 8,
        refused_command_bytes_max: 1000,
    };
    let big = vec![b'x'; 500];
    let mut input = encode_command(&command(&[b"SET", b"big", &big, b"EX"]));
    // Over the command's limit in all, each argument under its own.
    input.extend(encode_command(&command(&[b"SET", b"0123456789", b"0123456789"])));
    input.extend(encode_command(&command(&[b"GET", b"k"])));
    let argument_refusal = Parsed::Refused(
        "argument of 500 bytes is longer than the limit of 10 bytes (the largest value the \
         cluster stores)"
            .to_string(),
    );
    let command_refusal = Parsed::Refused("command longer than the limit of 15 bytes".to_string());
    let expected = vec![argument_refusal, command_refusal, command(&[b"GET", b"k"])];
    for cut in 0..=input.len() {
        let (commands, outcome) = parse_in_pieces(&input, &[cut], limits);
        assert_eq!(outcome, Ok(()), "cut at {cut}");
        assert_eq!(commands, expected, "cut at {cut}");
    }
    let cuts: Vec<usize> = (1..input.len()).collect();
    assert_eq!(parse_in_pieces(&input, &cuts, limits), (expected, Ok(())));
    // The dropped bytes are framed too: a refused argument must end with CRLF.
    let (_, outcome) = parse_in_pieces(b"*1\r\n$11\r\n0123456789ABC", &[], limits);
    assert_eq!(outcome, Err("Protocol error: bulk string not followed by CRLF".to_string()));
}

#[test]
fn every_resp_type_encodes_and_parses() {
    let cases: Vec<(Value, &[u8], &[u8])> = vec![
        (Value::simple("OK"), b"+OK\r\n", b"+OK\r\n"),
        (Value::error("ERR bad"), b"-ERR bad\r\n", b"-ERR bad\r\n"),
        (Value::Integer(-42), b":-42\r\n", b":-42\r\n"),
        (Value::bulk(b"a\r\nb"), b"$4\r\na\r\nb\r\n", b"$4\r\na\r\nb\r\n"),
        (Value::bulk(b""), b"$0\r\n\r\n", b"$0\r\n\r\n"),
        (Value::Null, b"$-1\r\n", b"_\r\n"),
        (
            Value::Array(vec![Value::Integer(1), Value::Null]),
            b"*2\r\n:1\r\n$-1\r\n",
            b"*2\r\n:1\r\n_\r\n",
        ),
        (
            Value::Map(vec![(Value::bulk(b"k"), Value::Integer(1))]),
            b"*2\r\n$1\r\nk\r\n:1\r\n",
            b"%1\r\n$1\r\nk\r\n:1\r\n",
        ),
        (Value::Set(vec![Value::Integer(1)]), b"*1\r\n:1\r\n", b"~1\r\n:1\r\n"),
        (Value::Double(1.5), b"$3\r\n1.5\r\n", b",1.5\r\n"),
        (Value::Double(f64::INFINITY), b"$3\r\ninf\r\n", b",inf\r\n"),
        (Value::Boolean(true), b":1\r\n", b"#t\r\n"),
        (Value::Boolean(false), b":0\r\n", b"#f\r\n"),
        (
            Value::BigNumber("-123456789012345678901234567890".to_string()),
            b"$31\r\n-123456789012345678901234567890\r\n",
            b"(-123456789012345678901234567890\r\n",
        ),
        (
            Value::VerbatimString { format: *b"txt", text: Bytes::from_static(b"hi") },
            b"$2\r\nhi\r\n",
            b"=6\r\ntxt:hi\r\n",
        ),
        (Value::Push(vec![Value::simple("x")]), b"*1\r\n+x\r\n", b">1\r\n+x\r\n"),
    ];
    for (value, resp2, resp3) in cases {
        assert_eq!(&value.to_bytes(Protocol::Resp2)[..], resp2, "{value:?} in RESP2");
        assert_eq!(&value.to_bytes(Protocol::Resp3)[..], resp3, "{value:?} in RESP3");
        assert_eq!(parse_value(resp3), Ok(Some((value.clone(), resp3.len()))));
        for cut in 0..resp3.len() {
            assert_eq!(parse_value(&resp3[..cut]), Ok(None), "{value:?} cut at {cut}");
        }
    }
    // RESP2 null array and RESP3 blob error.
    assert_eq!(parse_value(b"*-1\r\n"), Ok(Some((Value::Null, 5))));
    assert_eq!(parse_value(b"!3\r\nERR\r\n"), Ok(Some((Value::error("ERR"), 9))));
    // Line types cannot carry CR or LF: the encoder replaces them.
    assert_eq!(&Value::error("a\r\nb").to_bytes(Protocol::Resp2)[..], b"-a  b\r\n");
}

#[test]
fn malformed_values_are_errors() {
    let cases: &[&[u8]] = &[
        b"?\r\n",
        b":x\r\n",
        b"#x\r\n",
        b",x\r\n",
        b"(12a\r\n",
        b"$-2\r\n",
        b"$1\r\nabc\r\n",
        b"%-1\r\n",
        b"=2\r\nab\r\n",
        b"*9999999999\r\n",
    ];
    for input in cases {
        assert!(parse_value(input).is_err(), "{:?}", input.escape_ascii().to_string());
    }
    let deep = "*1\r\n".repeat(100);
    assert!(parse_value(deep.as_bytes()).is_err());
}

fn value_strategy() -> impl Strategy<Value = Value> {
    let text = "[a-zA-Z0-9 :_.-]{0,20}";
    let leaf = prop_oneof![
        text.prop_map(Value::SimpleString),
        text.prop_map(Value::Error),
        any::<i64>().prop_map(Value::Integer),
        proptest::collection::vec(any::<u8>(), 0..40)
            .prop_map(|bytes| Value::BulkString(bytes.into())),
        Just(Value::Null),
        any::<bool>().prop_map(Value::Boolean),
        (-1e300f64..1e300).prop_map(Value::Double),
        "-?[1-9][0-9]{0,40}".prop_map(Value::BigNumber),
        proptest::collection::vec(any::<u8>(), 0..20)
            .prop_map(|bytes| Value::VerbatimString { format: *b"txt", text: bytes.into() }),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Set),
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Push),
            proptest::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn encoded_values_parse_back(value in value_strategy()) {
        let bytes = value.to_bytes(Protocol::Resp3);
        prop_assert_eq!(parse_value(&bytes), Ok(Some((value, bytes.len()))));
    }

    #[test]
    fn encoded_commands_parse_back_from_any_split(
        commands in proptest::collection::vec(
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..30), 1..5),
            1..4,
        ),
        cut_fractions in proptest::collection::vec(0.0f64..1.0, 0..4),
    ) {
        let expected: Vec<Parsed> = commands
            .iter()
            .map(|arguments| Parsed::Command(arguments.iter().map(|argument| Bytes::copy_from_slice(argument)).collect()))
            .collect();
        let input: Vec<u8> = expected.iter().flat_map(encode_command).collect();
        let mut cuts: Vec<usize> =
            cut_fractions.iter().map(|fraction| (fraction * input.len() as f64) as usize).collect();
        cuts.sort_unstable();
        let (parsed, outcome) = parse_in_pieces(&input, &cuts, RequestLimits::default());
        prop_assert_eq!(outcome, Ok(()));
        prop_assert_eq!(parsed, expected);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_request_parser(
        input in proptest::collection::vec(any::<u8>(), 0..200),
        cut in 0usize..200,
    ) {
        let cut = cut.min(input.len());
        let _ = parse_in_pieces(&input, &[cut], RequestLimits { argument_bytes_max: 64, ..RequestLimits::default() });
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_value_parser(input in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_value(&input);
    }

    #[test]
    fn redis_integers_parse_like_redis(number in any::<i64>()) {
        prop_assert_eq!(crate::commands::parse_integer(number.to_string().as_bytes()), Some(number));
    }
}

#[test]
fn redis_integer_syntax_is_strict() {
    use crate::commands::parse_integer;
    for bad in ["", "-", "+1", " 1", "1 ", "01", "-0", "1.0", "9223372036854775808", "abc"] {
        assert_eq!(parse_integer(bad.as_bytes()), None, "{bad:?}");
    }
    assert_eq!(parse_integer(b"0"), Some(0));
    assert_eq!(parse_integer(b"-9223372036854775808"), Some(i64::MIN));
}
