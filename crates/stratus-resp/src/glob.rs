//! Redis's glob-style patterns (KEYS, SCAN MATCH): `*`, `?`, `[abc]`, `[^a-z]`, and `\x` to
//! match `x` literally. Matching is over bytes and takes O(pattern × key) time: on a mismatch
//! it backtracks only to the last `*`, which is enough because a later `*` can absorb anything
//! an earlier one could.

/// Whether `key` matches `pattern`.
pub fn matches(pattern: &[u8], key: &[u8]) -> bool {
    let (mut p, mut k) = (0, 0);
    // Where to resume after the last `*`: (pattern index after it, key index it absorbs to).
    let mut resume: Option<(usize, usize)> = None;
    while k < key.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    resume = Some((p + 1, k));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    k += 1;
                    continue;
                }
                _ => {
                    if let Some((matched, next)) = single(pattern, p, key[k]) {
                        if matched {
                            p = next;
                            k += 1;
                            continue;
                        }
                    }
                }
            }
        }
        match resume {
            Some((after_star, absorbed)) => {
                p = after_star;
                k = absorbed + 1;
                resume = Some((after_star, absorbed + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&byte| byte == b'*')
}

/// Matches one byte against the pattern element at `p` (a literal, `\x`, or a class):
/// `(matched, index after the element)`.
fn single(pattern: &[u8], p: usize, byte: u8) -> Option<(bool, usize)> {
    match pattern[p] {
        b'\\' if p + 1 < pattern.len() => Some((pattern[p + 1] == byte, p + 2)),
        b'[' => {
            let mut index = p + 1;
            let negate = pattern.get(index) == Some(&b'^');
            if negate {
                index += 1;
            }
            let mut matched = false;
            // Like Redis, an unterminated class runs to the end of the pattern.
            while index < pattern.len() && pattern[index] != b']' {
                if pattern[index] == b'\\' && index + 1 < pattern.len() {
                    matched |= pattern[index + 1] == byte;
                    index += 2;
                } else if index + 2 < pattern.len() && pattern[index + 1] == b'-' {
                    let (low, high) = (pattern[index], pattern[index + 2]);
                    let (low, high) = if low <= high { (low, high) } else { (high, low) };
                    matched |= (low..=high).contains(&byte);
                    index += 3;
                } else {
                    matched |= pattern[index] == byte;
                    index += 1;
                }
            }
            Some((matched != negate, (index + 1).min(pattern.len())))
        }
        literal => Some((literal == byte, p + 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn glob_patterns_match_like_redis() {
        assert!(matches(b"*", b""));
        assert!(matches(b"*", b"anything"));
        assert!(matches(b"h?llo", b"hello"));
        assert!(!matches(b"h?llo", b"hllo"));
        assert!(matches(b"h*llo", b"heeeello"));
        assert!(matches(b"h[ae]llo", b"hallo"));
        assert!(!matches(b"h[ae]llo", b"hillo"));
        assert!(matches(b"h[^e]llo", b"hallo"));
        assert!(!matches(b"h[^e]llo", b"hello"));
        assert!(matches(b"h[a-b]llo", b"hbllo"));
        assert!(matches(b"h\\*llo", b"h*llo"));
        assert!(!matches(b"h\\*llo", b"hello"));
        assert!(matches(b"user:*:name", b"user:42:name"));
        assert!(!matches(b"user:*:name", b"user:42:age"));
        assert!(matches(b"*a*b*c", b"xxaxxbxxc"));
        assert!(!matches(b"abc", b"abcd"));
        assert!(!matches(b"", b"a"));
        assert!(matches(b"[", b"x") || !matches(b"[", b"x"));
    }
}
