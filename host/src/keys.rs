//! What "the same action" means, in code: canonical arguments, their digest,
//! the idempotency key of each guarded send, and the fingerprint of a
//! request. The contract is written out in `docs/keys.md`.

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Prefix of every key; the `1` versions the derivation.
pub const KEY_PREFIX: &str = "tg1_";
/// Length of every key: the prefix and 32 hex digits (128 bits).
pub const KEY_LEN: usize = KEY_PREFIX.len() + 32;

pub use crate::ledger::KeySecret;

/// The largest magnitude a JSON number in tool arguments may have: 2^53 − 1.
/// RFC 8785 writes every number as an IEEE-754 double, which holds every
/// integer up to here exactly and no further: `1234567890123456789` would
/// reach the plugin as `1234567890123456800`, and two different ids would
/// share one digest.
pub const MAX_EXACT_NUMBER: u64 = (1 << 53) - 1;

/// The tool arguments in RFC 8785 (JCS) canonical form: sorted keys, no
/// insignificant whitespace, canonical numbers and strings. What the plugin
/// receives, and what the digest is taken of.
///
/// # Errors
/// A number of magnitude over [`MAX_EXACT_NUMBER`] (it would lose
/// precision), named by its JSON pointer; or a value that cannot be
/// canonicalised (none that parsed).
pub fn canonical_args(args: &Value) -> Result<String, String> {
    if let Some((at, n)) = inexact_number(args, String::new()) {
        return Err(format!("the number {n} at `{at}` is beyond ±{MAX_EXACT_NUMBER} (2^53 − 1), where JSON numbers lose precision; send it as a string"));
    }
    serde_json_canonicalizer::to_string(args).map_err(|e| format!("cannot canonicalise the arguments: {e}"))
}

/// The first number in `value` that a double cannot hold exactly (or whose
/// magnitude is past 2^53 − 1), with its JSON pointer.
fn inexact_number(value: &Value, at: String) -> Option<(String, serde_json::Number)> {
    match value {
        Value::Number(n) => {
            let exact = match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => u <= MAX_EXACT_NUMBER,
                (_, Some(i), _) => i.unsigned_abs() <= MAX_EXACT_NUMBER,
                (_, _, Some(f)) => f.abs() <= MAX_EXACT_NUMBER as f64,
                _ => false,
            };
            (!exact).then(|| (if at.is_empty() { "/".into() } else { at }, n.clone()))
        }
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| inexact_number(v, format!("{at}/{i}"))),
        Value::Object(fields) => fields.iter().find_map(|(k, v)| inexact_number(v, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")))),
        _ => None,
    }
}

/// Lower-case hex sha256 of the canonical arguments.
pub fn args_digest(canonical: &str) -> String {
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

/// The arguments that name an irreversible tool's action, as the reviewer
/// declares them (`action` in the tool's policy): JSON pointers into the
/// arguments. With them, "the same arguments" — for replays, conflicts, keys
/// and the hold rule alike — means the same values there; whatever else the
/// arguments carry (a reason in words, a memo) can differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionFields(Vec<String>);

impl ActionFields {
    /// The declared pointers, as given (each `/…`, RFC 6901; none twice).
    ///
    /// # Errors
    /// An empty list, a pointer that does not start with `/`, or one given twice.
    pub fn new(pointers: Vec<String>) -> Result<Self, String> {
        if pointers.is_empty() {
            return Err("list the JSON pointers of the arguments that name the action, e.g. [\"/payment_intent\", \"/amount_cents\"]".into());
        }
        for (i, p) in pointers.iter().enumerate() {
            if !p.starts_with('/') {
                return Err(format!("`{p}` is not a JSON pointer into the arguments: start it with `/`, as in `/{p}`"));
            }
            if pointers[..i].contains(p) {
                return Err(format!("`{p}` is listed twice"));
            }
        }
        Ok(Self(pointers))
    }

    /// The pointers.
    pub fn pointers(&self) -> &[String] {
        &self.0
    }

    /// Lower-case hex sha256 over the named values in RFC 8785 form (an
    /// absent one as `null`), domain-separated from [`args_digest`] so the two
    /// never coincide.
    pub fn digest(&self, args: &Value) -> String {
        let named: serde_json::Map<String, Value> = self.0.iter().map(|p| (p.clone(), args.pointer(p).cloned().unwrap_or(Value::Null))).collect();
        let canonical = serde_json_canonicalizer::to_string(&Value::Object(named)).expect("values parsed from JSON canonicalise");
        hex::encode(Sha256::digest(format!("toolguard-action/v1\n{canonical}").as_bytes()))
    }
}

/// Everything that identifies one guarded send.
#[derive(Debug, Clone, Copy)]
pub struct KeyInput<'a> {
    /// The agent session.
    pub session: &'a str,
    /// The model's tool-call id.
    pub call_id: &'a str,
    /// The tool's name.
    pub tool: &'a str,
    /// [`args_digest`] of the call's arguments.
    pub args_digest: &'a str,
    /// Ordinal of the send within the tool call, from 0.
    pub step: u32,
    /// 0, unless an operator declared an earlier key of this step never sent.
    pub generation: u32,
}

/// How a key is written, as the downstream accepts it (`key_format` in the
/// policy): the same 128 bits either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyFormat {
    /// `tg1_` and 32 hex digits (the default).
    #[default]
    Toolguard,
    /// A UUID (RFC 9562, laid out as version 4: 122 of the bits, the version
    /// and variant fixed), for providers that take nothing else.
    Uuid,
    /// The 32 hex digits alone, for providers that take only letters and
    /// digits, or at most 32 characters.
    Hex,
}

impl KeyFormat {
    /// Its name in the policy (`key_format`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Toolguard => "toolguard",
            Self::Uuid => "uuid",
            Self::Hex => "hex",
        }
    }
}

/// The idempotency key for one guarded send: `tg1_` and 32 hex digits of an
/// HMAC-SHA256 (keyed by the ledger's secret) over the length-prefixed
/// fields. Stable for the same input; opaque ASCII of 36 characters.
pub fn mint(secret: &KeySecret, input: KeyInput<'_>) -> String {
    mint_as(secret, input, KeyFormat::Toolguard)
}

/// [`mint`], written in `format`: with [`KeyFormat::Uuid`], the same HMAC's
/// first 16 bytes as a lower-case UUID (`8-4-4-4-12` hex digits, 36
/// characters); with [`KeyFormat::Hex`], as 32 hex digits.
pub fn mint_as(secret: &KeySecret, input: KeyInput<'_>, format: KeyFormat) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(&secret.0).expect("HMAC takes any key length");
    mac.update(b"toolguard-key/v1");
    for field in [input.session, input.call_id, input.tool, input.args_digest] {
        mac.update(&(field.len() as u64).to_be_bytes());
        mac.update(field.as_bytes());
    }
    mac.update(&input.step.to_be_bytes());
    if input.generation > 0 {
        // Only operator-minted keys carry it, so generation-0 keys never change.
        mac.update(b"generation");
        mac.update(&input.generation.to_be_bytes());
    }
    let tag = mac.finalize().into_bytes();
    let mut bits: [u8; 16] = tag[..16].try_into().expect("HMAC-SHA256 gives 32 bytes");
    match format {
        KeyFormat::Toolguard => format!("{KEY_PREFIX}{}", hex::encode(bits)),
        KeyFormat::Hex => hex::encode(bits),
        KeyFormat::Uuid => {
            bits[6] = (bits[6] & 0x0f) | 0x40; // version 4
            bits[8] = (bits[8] & 0x3f) | 0x80; // the RFC's variant
            let h = hex::encode(bits);
            format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
        }
    }
}

/// Lower-case hex sha256 over a request as the plugin built it (before the
/// host adds the key or credentials): method, URL, headers sorted by
/// lower-case name, body — each length-prefixed.
pub fn request_fingerprint(method: &str, url: &str, headers: &[(String, String)], body: &[u8]) -> String {
    let mut sorted: Vec<(String, &str)> = headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.as_str())).collect();
    sorted.sort();
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(method.to_ascii_uppercase().as_bytes());
    field(url.as_bytes());
    for (name, value) in &sorted {
        field(name.as_bytes());
        field(value.as_bytes());
    }
    field(body);
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input<'a>(session: &'a str, call_id: &'a str, digest: &'a str, step: u32) -> KeyInput<'a> {
        KeyInput { session, call_id, tool: "refund", args_digest: digest, step, generation: 0 }
    }

    #[test]
    fn an_action_digest_reads_only_the_named_arguments() {
        let action = ActionFields::new(vec!["/payment_intent".into(), "/amount_cents".into()]).unwrap();
        let a = json!({"payment_intent": "pi_1", "amount_cents": 1500, "reason": "duplicate"});
        let reworded = json!({"reason": "requested_by_customer", "amount_cents": 1500, "payment_intent": "pi_1", "memo": "again"});
        assert_eq!(action.digest(&a), action.digest(&reworded));
        assert_ne!(action.digest(&a), action.digest(&json!({"payment_intent": "pi_1", "amount_cents": 1501})));
        assert_ne!(action.digest(&a), action.digest(&json!({"payment_intent": "pi_2", "amount_cents": 1500})));
        // Absent is `null`, and neither equals the whole arguments' digest.
        assert_eq!(action.digest(&json!({"amount_cents": 1500})), action.digest(&json!({"amount_cents": 1500, "payment_intent": null})));
        let whole = json!({"/amount_cents": 1500, "/payment_intent": "pi_1"});
        assert_ne!(action.digest(&a), args_digest(&canonical_args(&whole).unwrap()));
        let nested = ActionFields::new(vec!["/to/0".into()]).unwrap();
        assert_ne!(nested.digest(&json!({"to": ["a"]})), nested.digest(&json!({"to": ["b"]})));
    }

    #[test]
    fn action_fields_are_pointers_each_given_once() {
        assert!(ActionFields::new(vec![]).unwrap_err().contains("JSON pointers"));
        assert!(ActionFields::new(vec!["amount".into()]).unwrap_err().contains("start it with `/`"));
        assert!(ActionFields::new(vec!["/a".into(), "/a".into()]).unwrap_err().contains("twice"));
    }

    #[test]
    fn canonical_form_ignores_order_and_whitespace_but_not_values() {
        let a = canonical_args(&serde_json::from_str(r#"{ "b": 1, "a": [1, 2.0, "x"] }"#).unwrap()).unwrap();
        let b = canonical_args(&serde_json::from_str(r#"{"a":[1,2,"x"],"b":1}"#).unwrap()).unwrap();
        assert_eq!(a, r#"{"a":[1,2,"x"],"b":1}"#);
        assert_eq!(args_digest(&a), args_digest(&b));
        let c = canonical_args(&json!({"a": [1, 2, "x"], "b": 2})).unwrap();
        assert_ne!(args_digest(&a), args_digest(&c));
    }

    #[test]
    fn numbers_are_exact_or_refused() {
        let max = MAX_EXACT_NUMBER;
        let exact = canonical_args(&serde_json::from_str(&format!(r#"{{"id":{max},"neg":-{max},"f":0.5}}"#)).unwrap()).unwrap();
        assert_eq!(exact, format!(r#"{{"f":0.5,"id":{max},"neg":-{max}}}"#), "the plugin receives what the caller sent");
        for text in [
            r#"{"id":1234567890123456789}"#,
            r#"{"id":-1234567890123456789}"#,
            r#"{"id":12345678901234567890}"#,
            r#"{"deep":[{"id":123456789012345678901234567890}]}"#,
            r#"{"big":1e300}"#,
            &format!(r#"{{"id":{}}}"#, max + 1),
        ] {
            let err = canonical_args(&serde_json::from_str(text).unwrap()).unwrap_err();
            assert!(err.contains("send it as a string"), "{text}: {err}");
        }
        let err = canonical_args(&serde_json::from_str(r#"{"a/b":[0,{"id":12345678901234567890}]}"#).unwrap()).unwrap_err();
        assert!(err.contains("`/a~1b/1/id`"), "{err}");
        // Two ids that used to share a digest are now refused, not merged.
        let (a, b) = (json!({"id": 1234567890123456789u64}), json!({"id": 1234567890123456790u64}));
        assert!(canonical_args(&a).is_err() && canonical_args(&b).is_err());
    }

    #[test]
    fn keys_are_stable_short_ascii_and_depend_on_every_field() {
        let secret = KeySecret([7; 32]);
        let k = mint(&secret, input("s", "c", "d", 0));
        assert_eq!(k, mint(&secret, input("s", "c", "d", 0)), "stable");
        assert_eq!(k.len(), KEY_LEN);
        assert!(k.len() <= 40 && k.is_ascii() && k.starts_with(KEY_PREFIX));
        let others = [
            mint(&secret, input("s2", "c", "d", 0)),
            mint(&secret, input("s", "c2", "d", 0)),
            mint(&secret, input("s", "c", "d2", 0)),
            mint(&secret, input("s", "c", "d", 1)),
            mint(&secret, KeyInput { generation: 1, ..input("s", "c", "d", 0) }),
            mint(&secret, KeyInput { tool: "other", ..input("s", "c", "d", 0) }),
            mint(&KeySecret([8; 32]), input("s", "c", "d", 0)),
            // Length prefixes: moving a character between fields changes the key.
            mint(&secret, input("sc", "", "d", 0)),
        ];
        for other in others {
            assert_ne!(k, other);
        }
        let named = mint(&secret, input("session-alpha", "call-beta", "d", 0));
        assert!(named[KEY_PREFIX.len()..].chars().all(|c| c.is_ascii_hexdigit()), "nothing but hex after the prefix");
    }

    #[test]
    fn a_uuid_key_is_the_same_bits_laid_out_as_a_version_4_uuid() {
        let secret = KeySecret([7; 32]);
        let id = input("s", "c", "d", 0);
        let (plain, uuid) = (mint(&secret, id), mint_as(&secret, id, KeyFormat::Uuid));
        assert_eq!(uuid, mint_as(&secret, id, KeyFormat::Uuid), "stable");
        let groups: Vec<&str> = uuid.split('-').collect();
        assert_eq!(groups.iter().map(|g| g.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12], "{uuid}");
        assert!(uuid.chars().all(|c| c == '-' || matches!(c, '0'..='9' | 'a'..='f')), "{uuid}");
        assert!(groups[2].starts_with('4') && matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'), "version 4, RFC variant: {uuid}");
        // The other 122 bits are the plain key's.
        let (p, u) = (&plain.as_bytes()[KEY_PREFIX.len()..], uuid.replace('-', "").into_bytes());
        for i in (0..32).filter(|i| *i != 12 && *i != 16) {
            assert_eq!(p[i], u[i], "digit {i}: {plain} {uuid}");
        }
        assert_ne!(uuid, mint_as(&secret, input("s", "c", "d", 1), KeyFormat::Uuid), "another step, another key");
        assert_eq!(mint_as(&secret, id, KeyFormat::Hex), plain[KEY_PREFIX.len()..], "hex: the plain key's digits alone");
    }

    #[test]
    fn fingerprints_ignore_header_order_and_case_only() {
        let h1 = vec![("A".into(), "1".into()), ("b".into(), "2".into())];
        let h2 = vec![("b".into(), "2".into()), ("a".into(), "1".into())];
        let f = request_fingerprint("post", "http://x/y", &h1, b"body");
        assert_eq!(f, request_fingerprint("POST", "http://x/y", &h2, b"body"));
        assert_ne!(f, request_fingerprint("POST", "http://x/y", &h2, b"bodz"));
        assert_ne!(f, request_fingerprint("POST", "http://x/z", &h2, b"body"));
    }
}
