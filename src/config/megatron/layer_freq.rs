//! `--moe-layer-freq` as Megatron's `moe_freq_type` reads it (arguments.py 326-345): an
//! integer N (one MoE layer every N, from the first), or a Python list expression over
//! digits, commas, brackets, parentheses, `+` and `*` such as `([0]*3+[1]*58)`, which
//! Megatron `eval`s after checking those characters. We evaluate the same grammar
//! without Python: sums of terms, terms products of factors, factors an integer, a list
//! of integers or a parenthesised expression; a list times an integer repeats it.

/// What `--moe-layer-freq` says, before the number of layers is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerFreq {
    Every(u64),
    Pattern(Vec<u64>),
}

/// Longest pattern accepted: far above any model's layer count, low enough that a typo
/// such as `[1]*10**9` cannot exhaust memory.
const MAX_PATTERN: usize = 1 << 16;

impl LayerFreq {
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if !text.contains('[') {
            return super::argparse::parse_count(text)
                .filter(|n| *n > 0)
                .map(LayerFreq::Every);
        }
        let chars: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
        let mut at = 0;
        match expr(&chars, &mut at)? {
            Value::List(l) if at == chars.len() => Some(LayerFreq::Pattern(l)),
            _ => None,
        }
    }

    /// One flag per layer, true for an MoE layer (Megatron: `i % N == 0` for an integer).
    /// `None` when a pattern's length is not the number of layers, or holds other than 0/1.
    pub fn layers(&self, num_layers: u64) -> Option<Vec<bool>> {
        match self {
            LayerFreq::Every(n) => Some((0..num_layers).map(|i| i % n == 0).collect()),
            LayerFreq::Pattern(p) => {
                if p.len() as u64 != num_layers || p.iter().any(|v| *v > 1) {
                    return None;
                }
                Some(p.iter().map(|v| *v == 1).collect())
            }
        }
    }
}

enum Value {
    Int(u64),
    List(Vec<u64>),
}

fn expr(c: &[char], at: &mut usize) -> Option<Value> {
    let mut left = term(c, at)?;
    while c.get(*at) == Some(&'+') {
        *at += 1;
        let right = term(c, at)?;
        left = match (left, right) {
            (Value::Int(a), Value::Int(b)) => Value::Int(a.checked_add(b)?),
            (Value::List(mut a), Value::List(b)) => {
                a.extend(b);
                bounded(a)?
            }
            _ => return None,
        };
    }
    Some(left)
}

fn term(c: &[char], at: &mut usize) -> Option<Value> {
    let mut left = factor(c, at)?;
    while c.get(*at) == Some(&'*') {
        *at += 1;
        let right = factor(c, at)?;
        left = match (left, right) {
            (Value::Int(a), Value::Int(b)) => Value::Int(a.checked_mul(b)?),
            (Value::List(l), Value::Int(n)) | (Value::Int(n), Value::List(l)) => {
                if l.len().checked_mul(n as usize)? > MAX_PATTERN {
                    return None;
                }
                Value::List(l.repeat(n as usize))
            }
            _ => return None,
        };
    }
    Some(left)
}

fn factor(c: &[char], at: &mut usize) -> Option<Value> {
    match c.get(*at)? {
        '(' => {
            *at += 1;
            let v = expr(c, at)?;
            (c.get(*at) == Some(&')')).then_some(())?;
            *at += 1;
            Some(v)
        }
        '[' => {
            *at += 1;
            let mut items = Vec::new();
            while c.get(*at) != Some(&']') {
                items.push(int(c, at)?);
                match c.get(*at)? {
                    ',' => *at += 1,
                    ']' => {}
                    _ => return None,
                }
            }
            *at += 1;
            bounded(items)
        }
        _ => int(c, at).map(Value::Int),
    }
}

fn bounded(list: Vec<u64>) -> Option<Value> {
    (list.len() <= MAX_PATTERN).then_some(Value::List(list))
}

fn int(c: &[char], at: &mut usize) -> Option<u64> {
    let start = *at;
    while c.get(*at).is_some_and(char::is_ascii_digit) {
        *at += 1;
    }
    c[start..*at].iter().collect::<String>().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(text: &str, n: u64) -> Option<Vec<u8>> {
        let v = LayerFreq::parse(text)?.layers(n)?;
        Some(v.into_iter().map(u8::from).collect())
    }

    #[test]
    fn integers_and_lists_read_as_megatron_evaluates_them() {
        assert_eq!(layers("1", 3), Some(vec![1, 1, 1]));
        assert_eq!(layers("2", 5), Some(vec![1, 0, 1, 0, 1]));
        assert_eq!(layers("([0]*3+[1]*2)", 5), Some(vec![0, 0, 0, 1, 1]));
        assert_eq!(layers("[0]+[1]*2", 3), Some(vec![0, 1, 1]));
        // Docstring examples of moe_freq_type.
        assert_eq!(
            layers("([1]*3+[0]*1)*3", 12),
            Some(vec![1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0])
        );
        assert_eq!(layers("([1]*3+[0]*2)*2", 10).map(|v| v.len()), Some(10));
        assert_eq!(layers("[1, 0, 1]", 3), Some(vec![1, 0, 1]));
        let ds = layers("([0]*3+[1]*58)", 61).unwrap();
        assert_eq!(ds.iter().filter(|v| **v == 1).count(), 58);
    }

    #[test]
    fn malformed_or_mismatched_patterns_are_refused() {
        for bad in [
            "0",
            "x",
            "[0]*",
            "([0]*3",
            "[0]-[1]",
            "[0]+1",
            "[1]*100000000",
            "[2]",
        ] {
            assert_eq!(layers(bad, 1), None, "{bad}");
        }
        assert_eq!(layers("[1]*3", 4), None);
    }
}
