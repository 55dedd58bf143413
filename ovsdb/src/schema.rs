//! The part of a database schema (RFC 7047 §3.2, the `get_schema` reply)
//! the client needs: which tables and columns exist and whether each column
//! is a scalar, a set or a map, because an `update2` diff of a set or map
//! says what changed, not the new value.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::value::ColumnKind;

/// A database schema, reduced to column kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseSchema {
    pub name: String,
    pub version: String,
    pub tables: BTreeMap<String, TableSchema>,
}

/// One table's columns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableSchema {
    pub columns: BTreeMap<String, ColumnKind>,
}

/// A `get_schema` reply that is not a schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("schema member {member:?} is missing or not a {expected}")]
    Member {
        member: &'static str,
        expected: &'static str,
    },
    #[error("table {table}: column {column} has no valid type")]
    ColumnType { table: String, column: String },
}

impl DatabaseSchema {
    /// Parses a `<database-schema>`.
    pub fn from_json(json: &Json) -> Result<Self, SchemaError> {
        let member =
            |member: &'static str, expected: &'static str| SchemaError::Member { member, expected };
        let name = json
            .get("name")
            .and_then(Json::as_str)
            .ok_or(member("name", "string"))?;
        let version = json
            .get("version")
            .and_then(Json::as_str)
            .ok_or(member("version", "string"))?;
        let tables = json
            .get("tables")
            .and_then(Json::as_object)
            .ok_or(member("tables", "object"))?;
        let mut out = BTreeMap::new();
        for (table, t) in tables {
            let columns = t
                .get("columns")
                .and_then(Json::as_object)
                .ok_or(member("columns", "object"))?;
            let mut cols = BTreeMap::new();
            for (column, c) in columns {
                let kind =
                    c.get("type")
                        .and_then(column_kind)
                        .ok_or_else(|| SchemaError::ColumnType {
                            table: table.clone(),
                            column: column.clone(),
                        })?;
                cols.insert(column.clone(), kind);
            }
            out.insert(table.clone(), TableSchema { columns: cols });
        }
        Ok(Self {
            name: name.to_owned(),
            version: version.to_owned(),
            tables: out,
        })
    }

    /// The kind of `table.column`, if the schema has it.
    pub fn column(&self, table: &str, column: &str) -> Option<ColumnKind> {
        self.tables.get(table)?.columns.get(column).copied()
    }
}

/// The kind of a column `<type>`: an atomic type name is a scalar; an
/// object is a map if it has a `value`, else a scalar when `min` and `max`
/// are both 1 (their defaults), else a set.
fn column_kind(ty: &Json) -> Option<ColumnKind> {
    match ty {
        Json::String(_) => Some(ColumnKind::Scalar),
        Json::Object(o) => {
            o.get("key")?;
            if o.contains_key("value") {
                return Some(ColumnKind::Map);
            }
            let min = o.get("min").map_or(Some(1), Json::as_u64)?;
            let max = match o.get("max") {
                None => Some(1),
                Some(Json::String(s)) if s == "unlimited" => None,
                Some(m) => Some(m.as_u64()?),
            };
            Some(if min == 1 && max == Some(1) {
                ColumnKind::Scalar
            } else {
                ColumnKind::Set
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `get_schema` reply of Debian 12's `ovsdb-server` (Open vSwitch
    /// 3.1) for `vswitch.ovsschema`.
    fn vswitch() -> DatabaseSchema {
        let reply: Json =
            serde_json::from_str(include_str!("../fixtures/get_schema_reply.json")).unwrap();
        DatabaseSchema::from_json(&reply["result"]).unwrap()
    }

    #[test]
    fn the_recorded_vswitch_schema_gives_each_column_its_kind() {
        let s = vswitch();
        assert_eq!(s.name, "Open_vSwitch");
        assert_eq!(s.version, "8.3.1");
        assert_eq!(s.column("Bridge", "name"), Some(ColumnKind::Scalar));
        assert_eq!(
            s.column("Bridge", "datapath_type"),
            Some(ColumnKind::Scalar)
        );
        assert_eq!(s.column("Bridge", "ports"), Some(ColumnKind::Set));
        // Optional integer: min 0, max 1.
        assert_eq!(s.column("Port", "tag"), Some(ColumnKind::Set));
        assert_eq!(s.column("Interface", "external_ids"), Some(ColumnKind::Map));
        assert_eq!(s.column("Open_vSwitch", "bridges"), Some(ColumnKind::Set));
        assert_eq!(s.column("Interface", "no_such_column"), None);
    }

    #[test]
    fn a_reply_that_is_not_a_schema_is_an_error() {
        assert_eq!(
            DatabaseSchema::from_json(&serde_json::json!({"name": "x", "version": "1"})),
            Err(SchemaError::Member {
                member: "tables",
                expected: "object"
            })
        );
        assert!(matches!(
            DatabaseSchema::from_json(&serde_json::json!({
                "name": "x", "version": "1",
                "tables": {"T": {"columns": {"c": {"type": {"min": 0}}}}}
            })),
            Err(SchemaError::ColumnType { .. })
        ));
    }
}
