//! OVSDB values as RFC 7047 §5.1 writes them in JSON: atoms (integer, real,
//! boolean, string, `["uuid", …]`, `["named-uuid", …]`), sets
//! (`["set", [atoms]]`, or a bare atom for a set of one) and maps
//! (`["map", [[key, value], …]]`).

use std::fmt;

use serde_json::Value as Json;

/// A row's UUID, as the server spells it (36 characters of lower-case hex
/// and dashes). Kept as text: the client only compares and prints them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uuid(pub String);

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One OVSDB atom.
#[derive(Debug, Clone, PartialEq)]
pub enum Atom {
    Integer(i64),
    Real(f64),
    Boolean(bool),
    String(String),
    /// A reference to a row: `["uuid", "…"]`.
    Uuid(Uuid),
    /// A row inserted earlier in the same transaction: `["named-uuid", "…"]`.
    NamedUuid(String),
}

/// One OVSDB value: what a column holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A lone atom: a scalar column, or a set of exactly one element as the
    /// server writes it.
    Atom(Atom),
    Set(Vec<Atom>),
    /// Key/value pairs in the server's order; keys are unique.
    Map(Vec<(Atom, Atom)>),
}

/// A JSON text that is not an OVSDB value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("{json} is not an OVSDB atom")]
    NotAnAtom { json: String },
    #[error("{json} is not an OVSDB value")]
    NotAValue { json: String },
    #[error("map entry {json} is not a [key, value] pair")]
    NotAPair { json: String },
}

impl Atom {
    /// Parses an atom (RFC 7047 §5.1 `<atom>`).
    pub fn from_json(json: &Json) -> Result<Self, ValueError> {
        let not_atom = || ValueError::NotAnAtom {
            json: json.to_string(),
        };
        match json {
            Json::String(s) => Ok(Self::String(s.clone())),
            Json::Bool(b) => Ok(Self::Boolean(*b)),
            Json::Number(n) => n
                .as_i64()
                .map(Self::Integer)
                .or_else(|| n.as_f64().map(Self::Real))
                .ok_or_else(not_atom),
            Json::Array(a) => match a.as_slice() {
                [Json::String(tag), Json::String(id)] if tag == "uuid" => {
                    Ok(Self::Uuid(Uuid(id.clone())))
                }
                [Json::String(tag), Json::String(id)] if tag == "named-uuid" => {
                    Ok(Self::NamedUuid(id.clone()))
                }
                _ => Err(not_atom()),
            },
            Json::Null | Json::Object(_) => Err(not_atom()),
        }
    }

    /// The atom as the wire writes it.
    pub fn to_json(&self) -> Json {
        match self {
            Self::Integer(i) => Json::from(*i),
            Self::Real(r) => Json::from(*r),
            Self::Boolean(b) => Json::from(*b),
            Self::String(s) => Json::from(s.as_str()),
            Self::Uuid(u) => Json::from(vec!["uuid", u.0.as_str()]),
            Self::NamedUuid(n) => Json::from(vec!["named-uuid", n.as_str()]),
        }
    }

    /// The string, if this is a string atom.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The UUID, if this is a row reference.
    pub fn as_uuid(&self) -> Option<&Uuid> {
        match self {
            Self::Uuid(u) => Some(u),
            _ => None,
        }
    }
}

impl Value {
    /// Parses a value (RFC 7047 §5.1 `<value>`).
    pub fn from_json(json: &Json) -> Result<Self, ValueError> {
        if let Json::Array(a) = json
            && let [Json::String(tag), Json::Array(items)] = a.as_slice()
        {
            match tag.as_str() {
                "set" => {
                    return items
                        .iter()
                        .map(Atom::from_json)
                        .collect::<Result<_, _>>()
                        .map(Self::Set);
                }
                "map" => {
                    return items
                        .iter()
                        .map(|pair| match pair.as_array().map(Vec::as_slice) {
                            Some([k, v]) => Ok((Atom::from_json(k)?, Atom::from_json(v)?)),
                            _ => Err(ValueError::NotAPair {
                                json: pair.to_string(),
                            }),
                        })
                        .collect::<Result<_, _>>()
                        .map(Self::Map);
                }
                _ => {}
            }
        }
        Atom::from_json(json)
            .map(Self::Atom)
            .map_err(|_| ValueError::NotAValue {
                json: json.to_string(),
            })
    }

    /// The value as the wire writes it.
    pub fn to_json(&self) -> Json {
        match self {
            Self::Atom(a) => a.to_json(),
            Self::Set(s) => Json::from(vec![
                Json::from("set"),
                Json::from(s.iter().map(Atom::to_json).collect::<Vec<_>>()),
            ]),
            Self::Map(m) => Json::from(vec![
                Json::from("map"),
                Json::from(
                    m.iter()
                        .map(|(k, v)| Json::from(vec![k.to_json(), v.to_json()]))
                        .collect::<Vec<_>>(),
                ),
            ]),
        }
    }

    /// The elements of a set (a lone atom is a set of one); `None` for a map.
    pub fn atoms(&self) -> Option<&[Atom]> {
        match self {
            Self::Atom(a) => Some(std::slice::from_ref(a)),
            Self::Set(s) => Some(s),
            Self::Map(_) => None,
        }
    }

    /// The string of a string column, or of an optional string column that
    /// holds one.
    pub fn as_str(&self) -> Option<&str> {
        match self.atoms()? {
            [a] => a.as_str(),
            _ => None,
        }
    }

    /// The value of `key` in a map with string keys.
    pub fn map_get(&self, key: &str) -> Option<&Atom> {
        match self {
            Self::Map(m) => m
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The row references in a set (or lone atom) of UUIDs.
    pub fn uuids(&self) -> impl Iterator<Item = &Uuid> {
        self.atoms()
            .unwrap_or_default()
            .iter()
            .filter_map(Atom::as_uuid)
    }

    /// Applies an `update2` "modify" diff (the `ovsdb-server(7)` `<diff>`)
    /// of a column of `kind` to `old` (`None`: the column's default, which
    /// the server leaves out of rows) and returns the new value.
    ///
    /// A scalar column's diff is its new value. A set's diff lists elements
    /// that are in exactly one of old and new, so each one toggles. A map's
    /// diff lists pairs: a key the old map lacks is added, a key it has with
    /// the same value is removed, a key it has with another value takes the
    /// new value.
    pub fn apply_diff(old: Option<Self>, diff: Self, kind: ColumnKind) -> Self {
        match kind {
            ColumnKind::Scalar => diff,
            ColumnKind::Set => {
                let mut set = match old {
                    Some(Self::Set(s)) => s,
                    Some(Self::Atom(a)) => vec![a],
                    Some(Self::Map(_)) | None => Vec::new(),
                };
                let toggles = match diff {
                    Self::Atom(a) => vec![a],
                    Self::Set(s) => s,
                    Self::Map(_) => Vec::new(),
                };
                for atom in toggles {
                    if let Some(i) = set.iter().position(|a| *a == atom) {
                        set.remove(i);
                    } else {
                        set.push(atom);
                    }
                }
                Self::Set(set)
            }
            ColumnKind::Map => {
                let mut map = match old {
                    Some(Self::Map(m)) => m,
                    _ => Vec::new(),
                };
                let Self::Map(pairs) = diff else {
                    return Self::Map(map);
                };
                for (k, v) in pairs {
                    match map.iter().position(|(mk, _)| *mk == k) {
                        Some(i) if map[i].1 == v => {
                            map.remove(i);
                        }
                        Some(i) => map[i].1 = v,
                        None => map.push((k, v)),
                    }
                }
                Self::Map(map)
            }
        }
    }
}

/// How a column's values are written, from its schema type: what an
/// `update2` diff of it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// Exactly one atom (`min` = `max` = 1, no `value`).
    Scalar,
    /// A set of atoms (possibly optional: `min` 0, `max` 1).
    Set,
    /// A map (the type has a `value`).
    Map,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v(j: &Json) -> Value {
        Value::from_json(j).unwrap()
    }

    #[test]
    fn atoms_sets_and_maps_parse_and_round_trip() {
        for j in [
            json!(5),
            json!(-1.5),
            json!(true),
            json!("br-ex"),
            json!(["uuid", "2d5fe5fa-5cc7-458a-a493-34e1f78be013"]),
            json!(["named-uuid", "row1"]),
            json!(["set", []]),
            json!(["set", [["uuid", "a"], ["uuid", "b"]]]),
            json!(["map", [["iface-id", "x"], ["sandbox", "y"]]]),
        ] {
            assert_eq!(v(&j).to_json(), j, "{j}");
        }
        assert_eq!(
            v(&json!(["uuid", "a"])),
            Value::Atom(Atom::Uuid(Uuid("a".into())))
        );
        assert_eq!(
            v(&json!(["map", [["k", "v"]]])).map_get("k"),
            Some(&Atom::String("v".into()))
        );
        assert_eq!(v(&json!(["set", ["only"]])).as_str(), Some("only"));
        assert_eq!(v(&json!(["set", []])).as_str(), None);
        let refs: Vec<_> = v(&json!(["set", [["uuid", "a"], ["uuid", "b"]]]))
            .uuids()
            .map(|u| u.0.clone())
            .collect();
        assert_eq!(refs, ["a", "b"]);
    }

    #[test]
    fn non_values_are_errors() {
        assert!(matches!(
            Value::from_json(&json!(null)),
            Err(ValueError::NotAValue { .. })
        ));
        assert!(matches!(
            Value::from_json(&json!({"a": 1})),
            Err(ValueError::NotAValue { .. })
        ));
        assert!(matches!(
            Value::from_json(&json!(["set", [{"a": 1}]])),
            Err(ValueError::NotAnAtom { .. })
        ));
        assert!(matches!(
            Value::from_json(&json!(["map", [["k"]]])),
            Err(ValueError::NotAPair { .. })
        ));
        assert!(matches!(
            Value::from_json(&json!(["uuid", 5])),
            Err(ValueError::NotAValue { .. })
        ));
    }

    #[test]
    fn diffs_toggle_set_elements_and_add_replace_or_remove_map_keys() {
        let set = Value::apply_diff(
            Some(v(&json!(["set", [["uuid", "a"], ["uuid", "b"]]]))),
            v(&json!(["set", [["uuid", "b"], ["uuid", "c"]]])),
            ColumnKind::Set,
        );
        assert_eq!(
            set.to_json(),
            json!(["set", [["uuid", "a"], ["uuid", "c"]]])
        );
        // A bare atom diff toggles one element; a missing column is empty.
        let set = Value::apply_diff(None, v(&json!(["uuid", "a"])), ColumnKind::Set);
        assert_eq!(set.to_json(), json!(["set", [["uuid", "a"]]]));

        let map = Value::apply_diff(
            Some(v(&json!(["map", [["same", "1"], ["other", "1"]]]))),
            v(&json!([
                "map",
                [["same", "1"], ["other", "2"], ["new", "3"]]
            ])),
            ColumnKind::Map,
        );
        assert_eq!(
            map.to_json(),
            json!(["map", [["other", "2"], ["new", "3"]]])
        );

        let scalar =
            Value::apply_diff(Some(v(&json!(""))), v(&json!("netdev")), ColumnKind::Scalar);
        assert_eq!(scalar.as_str(), Some("netdev"));
    }
}
