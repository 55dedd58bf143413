//! A local copy of the monitored tables, kept current by the server's
//! `update` (RFC 7047 §4.1.6) and `update2` (`ovsdb-server(7)`)
//! notifications: tables → rows by UUID → columns.
//!
//! The server leaves out of `update2` rows every column that holds its
//! default (an empty string, set or map), so a column missing from a [`Row`]
//! reads as its default.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::schema::DatabaseSchema;
use crate::value::{Uuid, Value, ValueError};

/// One row: column name → value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub columns: BTreeMap<String, Value>,
}

impl Row {
    /// Parses a `<row>` object.
    pub fn from_json(table: &str, uuid: &str, json: &Json) -> Result<Self, UpdateError> {
        let obj = json.as_object().ok_or_else(|| UpdateError::Shape {
            what: "row",
            json: json.to_string(),
        })?;
        let mut columns = BTreeMap::new();
        for (column, v) in obj {
            let value = Value::from_json(v).map_err(|source| UpdateError::Value {
                table: table.to_owned(),
                row: uuid.to_owned(),
                column: column.clone(),
                source,
            })?;
            columns.insert(column.clone(), value);
        }
        Ok(Self { columns })
    }

    /// A row from `(column, value)` pairs.
    pub fn with<I, S>(columns: I) -> Self
    where
        I: IntoIterator<Item = (S, Value)>,
        S: Into<String>,
    {
        Self {
            columns: columns.into_iter().map(|(c, v)| (c.into(), v)).collect(),
        }
    }

    pub fn get(&self, column: &str) -> Option<&Value> {
        self.columns.get(column)
    }

    /// A string column's value; `""` (the default) when absent.
    pub fn str(&self, column: &str) -> &str {
        self.get(column).and_then(Value::as_str).unwrap_or("")
    }

    /// `key` of a string-to-string map column.
    pub fn map_str(&self, column: &str, key: &str) -> Option<&str> {
        self.get(column)?.map_get(key)?.as_str()
    }

    /// The rows a set-of-UUIDs column refers to (none when absent).
    pub fn uuids(&self, column: &str) -> impl Iterator<Item = &Uuid> {
        self.get(column).into_iter().flat_map(Value::uuids)
    }
}

/// Monitored tables: table name → rows by UUID.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replica {
    pub tables: BTreeMap<String, BTreeMap<Uuid, Row>>,
}

/// An update the replica cannot apply: the server and the replica disagree,
/// and only a fresh monitor (a resync) can mend that.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    #[error("malformed {what} in an update: {json}")]
    Shape { what: &'static str, json: String },
    #[error("table {table}, row {row}, column {column}: {source}")]
    Value {
        table: String,
        row: String,
        column: String,
        source: ValueError,
    },
    #[error("table {table}, row {row}: {op} of a row the replica does not have")]
    MissingRow {
        table: String,
        row: String,
        op: &'static str,
    },
    #[error("table {table}: the schema has no column {column} to apply a diff to")]
    UnknownColumn { table: String, column: String },
    #[error("table {table}, row {row}: unknown row update {op:?}")]
    UnknownOp {
        table: String,
        row: String,
        op: String,
    },
}

fn object<'a>(
    json: &'a Json,
    what: &'static str,
) -> Result<&'a serde_json::Map<String, Json>, UpdateError> {
    json.as_object().ok_or_else(|| UpdateError::Shape {
        what,
        json: json.to_string(),
    })
}

impl Replica {
    /// The rows of `table` (none if it is not monitored).
    pub fn rows(&self, table: &str) -> impl Iterator<Item = (&Uuid, &Row)> {
        self.tables.get(table).into_iter().flatten()
    }

    pub fn row(&self, table: &str, uuid: &Uuid) -> Option<&Row> {
        self.tables.get(table)?.get(uuid)
    }

    /// Adds or replaces a row.
    pub fn insert(&mut self, table: &str, uuid: Uuid, row: Row) {
        self.tables
            .entry(table.to_owned())
            .or_default()
            .insert(uuid, row);
    }

    /// Applies a `<table-updates>` (the `monitor` reply and its `update`
    /// notifications): a row update with only `new` inserts, with `old` and
    /// `new` modifies (the changed columns' new values, merged), with only
    /// `old` deletes.
    ///
    /// On an error the replica may be half updated: the caller resyncs.
    pub fn apply_update(&mut self, updates: &Json) -> Result<(), UpdateError> {
        for (table, rows) in object(updates, "table-updates")? {
            let rows = object(rows, "table-update")?;
            let t = self.tables.entry(table.clone()).or_default();
            for (uuid, ru) in rows {
                let ru = object(ru, "row-update")?;
                let key = Uuid(uuid.clone());
                match (ru.get("old"), ru.get("new")) {
                    (None, Some(new)) => {
                        t.insert(key, Row::from_json(table, uuid, new)?);
                    }
                    (Some(_), Some(new)) => {
                        let changed = Row::from_json(table, uuid, new)?;
                        let row = t.get_mut(&key).ok_or_else(|| UpdateError::MissingRow {
                            table: table.clone(),
                            row: uuid.clone(),
                            op: "modify",
                        })?;
                        row.columns.extend(changed.columns);
                    }
                    (Some(_), None) => {
                        t.remove(&key).ok_or_else(|| UpdateError::MissingRow {
                            table: table.clone(),
                            row: uuid.clone(),
                            op: "delete",
                        })?;
                    }
                    (None, None) => {
                        return Err(UpdateError::Shape {
                            what: "row-update (neither old nor new)",
                            json: Json::Object(ru.clone()).to_string(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies a `<table-updates2>` (the `monitor_cond` reply and its
    /// `update2` notifications): `initial` and `insert` carry the row,
    /// `modify` a diff per changed column (see [`Value::apply_diff`]; the
    /// column's kind comes from `schema`), `delete` nothing.
    ///
    /// On an error the replica may be half updated: the caller resyncs.
    pub fn apply_update2(
        &mut self,
        schema: &DatabaseSchema,
        updates: &Json,
    ) -> Result<(), UpdateError> {
        for (table, rows) in object(updates, "table-updates2")? {
            let rows = object(rows, "table-update2")?;
            let t = self.tables.entry(table.clone()).or_default();
            for (uuid, ru) in rows {
                let ru = object(ru, "row-update2")?;
                let key = Uuid(uuid.clone());
                let mut ops = ru.iter();
                let (Some((op, body)), None) = (ops.next(), ops.next()) else {
                    return Err(UpdateError::Shape {
                        what: "row-update2 (not exactly one member)",
                        json: Json::Object(ru.clone()).to_string(),
                    });
                };
                match op.as_str() {
                    "initial" | "insert" => {
                        t.insert(key, Row::from_json(table, uuid, body)?);
                    }
                    "modify" => {
                        let diff = Row::from_json(table, uuid, body)?;
                        let row = t.get_mut(&key).ok_or_else(|| UpdateError::MissingRow {
                            table: table.clone(),
                            row: uuid.clone(),
                            op: "modify",
                        })?;
                        for (column, d) in diff.columns {
                            let kind = schema.column(table, &column).ok_or_else(|| {
                                UpdateError::UnknownColumn {
                                    table: table.clone(),
                                    column: column.clone(),
                                }
                            })?;
                            let old = row.columns.remove(&column);
                            row.columns.insert(column, Value::apply_diff(old, d, kind));
                        }
                    }
                    "delete" => {
                        t.remove(&key).ok_or_else(|| UpdateError::MissingRow {
                            table: table.clone(),
                            row: uuid.clone(),
                            op: "delete",
                        })?;
                    }
                    other => {
                        return Err(UpdateError::UnknownOp {
                            table: table.clone(),
                            row: uuid.clone(),
                            op: other.to_owned(),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::schema::DatabaseSchema;

    /// Recorded from Debian 12's `ovsdb-server` (Open vSwitch 3.1) over its
    /// unix socket, one client on `monitor_cond` and one on `monitor`, both
    /// on `Open_vSwitch` {`external_ids`, `bridges`}, `Bridge` {`name`,
    /// `ports`, `datapath_type`}, `Port` {`name`, `interfaces`} and
    /// `Interface` {`name`, `type`, `external_ids`}. The database, built with
    /// `ovs-vsctl --no-wait`: `br-int` (`datapath_type=netdev`) with a
    /// secondary-network pod port `0123456789abcde_3` and an SR-IOV VF
    /// representor `vf0rep` carrying OVN-Kubernetes' `external_ids`; `br-ex`
    /// with `eth1`, bond `bond0` (`ens1f0`, `ens1f1`) and a patch port to
    /// `br-int`; `ovn-bridge-mappings=physnet1:br-ex`. Then, one
    /// `ovs-vsctl` each, the changes named by [`STEPS`].
    pub(crate) fn fixture(name: &str) -> Json {
        let text = match name {
            "monitor_cond_reply" => include_str!("../fixtures/monitor_cond_reply.json"),
            "monitor_reply" => include_str!("../fixtures/monitor_reply.json"),
            "update2_mapping_added" => include_str!("../fixtures/update2_mapping_added.json"),
            "update2_bridge_added" => include_str!("../fixtures/update2_bridge_added.json"),
            "update2_port_renamed" => include_str!("../fixtures/update2_port_renamed.json"),
            "update2_bond_member_removed" => {
                include_str!("../fixtures/update2_bond_member_removed.json")
            }
            "update2_port_deleted" => include_str!("../fixtures/update2_port_deleted.json"),
            "update2_datapath_changed" => {
                include_str!("../fixtures/update2_datapath_changed.json")
            }
            "update2_iface_ids_changed" => {
                include_str!("../fixtures/update2_iface_ids_changed.json")
            }
            "update2_mapping_removed" => {
                include_str!("../fixtures/update2_mapping_removed.json")
            }
            "update_mapping_added" => include_str!("../fixtures/update_mapping_added.json"),
            "update_bridge_added" => include_str!("../fixtures/update_bridge_added.json"),
            "update_port_renamed" => include_str!("../fixtures/update_port_renamed.json"),
            "update_bond_member_removed" => {
                include_str!("../fixtures/update_bond_member_removed.json")
            }
            "update_port_deleted" => include_str!("../fixtures/update_port_deleted.json"),
            "update_datapath_changed" => {
                include_str!("../fixtures/update_datapath_changed.json")
            }
            "update_iface_ids_changed" => {
                include_str!("../fixtures/update_iface_ids_changed.json")
            }
            "update_mapping_removed" => include_str!("../fixtures/update_mapping_removed.json"),
            other => panic!("no fixture {other}"),
        };
        serde_json::from_str(text).unwrap()
    }

    /// The recorded changes, in order:
    /// * `mapping_added`: `ovn-bridge-mappings=physnet1:br-ex,physnet2:br-phys2`
    /// * `bridge_added`: `add-br br-phys2 -- add-port br-phys2 eth2`
    /// * `port_renamed`: `del-port br-phys2 eth2 -- add-port br-phys2 eth3`
    ///   (a name is immutable: a rename is a delete and an insert)
    /// * `bond_member_removed`: `del-port bond0 -- add-port br-ex ens1f0`
    /// * `port_deleted`: `del-port br-phys2 eth3`
    /// * `datapath_changed`: `set bridge br-ex datapath_type=netdev`
    /// * `iface_ids_changed`: `pod-if-name=net9` on the pod port, `vf-is-vfio`
    ///   removed from the VF representor
    /// * `mapping_removed`: `remove open_vswitch . external_ids ovn-bridge-mappings`
    pub(crate) const STEPS: [&str; 8] = [
        "mapping_added",
        "bridge_added",
        "port_renamed",
        "bond_member_removed",
        "port_deleted",
        "datapath_changed",
        "iface_ids_changed",
        "mapping_removed",
    ];

    pub(crate) fn schema() -> DatabaseSchema {
        let reply: Json =
            serde_json::from_str(include_str!("../fixtures/get_schema_reply.json")).unwrap();
        DatabaseSchema::from_json(&reply["result"]).unwrap()
    }

    /// The replica a `monitor_cond` client holds after the initial reply and
    /// the first `steps` recorded `update2`s.
    pub(crate) fn replica2_after(steps: usize) -> Replica {
        let schema = schema();
        let mut r = Replica::default();
        r.apply_update2(&schema, &fixture("monitor_cond_reply")["result"])
            .unwrap();
        for step in &STEPS[..steps] {
            r.apply_update2(&schema, &fixture(&format!("update2_{step}"))["params"][1])
                .unwrap();
        }
        r
    }

    /// The same for a `monitor` client and the recorded `update`s.
    pub(crate) fn replica_after(steps: usize) -> Replica {
        let mut r = Replica::default();
        r.apply_update(&fixture("monitor_reply")["result"]).unwrap();
        for step in &STEPS[..steps] {
            r.apply_update(&fixture(&format!("update_{step}"))["params"][1])
                .unwrap();
        }
        r
    }

    /// A replica with the columns a `monitor` client sees filled in with the
    /// defaults `update2` leaves out, for comparing the two.
    fn with_defaults(r: &Replica) -> Replica {
        let defaults = [
            (
                "Interface",
                "type",
                Value::Atom(crate::Atom::String(String::new())),
            ),
            ("Interface", "external_ids", Value::Map(Vec::new())),
            (
                "Bridge",
                "datapath_type",
                Value::Atom(crate::Atom::String(String::new())),
            ),
            ("Bridge", "ports", Value::Set(Vec::new())),
            ("Port", "interfaces", Value::Set(Vec::new())),
            ("Open_vSwitch", "external_ids", Value::Map(Vec::new())),
            ("Open_vSwitch", "bridges", Value::Set(Vec::new())),
        ];
        let mut r = r.clone();
        for (table, column, default) in defaults {
            for row in r.tables.entry(table.into()).or_default().values_mut() {
                let v = row.columns.entry(column.into()).or_insert(default.clone());
                // A set of one as a lone atom, maps and sets in any order.
                *v = match v.clone() {
                    Value::Atom(a) if matches!(default, Value::Set(_)) => Value::Set(vec![a]),
                    Value::Set(mut s) => {
                        s.sort_by_key(|a| format!("{a:?}"));
                        Value::Set(s)
                    }
                    Value::Map(mut m) => {
                        m.sort_by_key(|(k, _)| format!("{k:?}"));
                        Value::Map(m)
                    }
                    Value::Atom(a) => Value::Atom(a),
                };
            }
        }
        r
    }

    #[test]
    fn update_and_update2_streams_build_the_same_replica_at_every_step() {
        for steps in 0..=STEPS.len() {
            assert_eq!(
                with_defaults(&replica2_after(steps)),
                with_defaults(&replica_after(steps)),
                "after {steps} steps"
            );
        }
        let r = replica2_after(0);
        assert_eq!(r.rows("Bridge").count(), 2);
        assert_eq!(r.rows("Port").count(), 7);
        assert_eq!(r.rows("Interface").count(), 8);
    }

    #[test]
    fn update2_diffs_change_sets_and_maps_as_recorded() {
        let before = replica2_after(0);
        let after = replica2_after(1);
        let ovs = |r: &Replica| r.rows("Open_vSwitch").next().unwrap().1.clone();
        assert_eq!(
            ovs(&before).map_str("external_ids", "ovn-bridge-mappings"),
            Some("physnet1:br-ex")
        );
        assert_eq!(
            ovs(&after).map_str("external_ids", "ovn-bridge-mappings"),
            Some("physnet1:br-ex,physnet2:br-phys2")
        );
        // The last step's diff names the key with its current value: removed.
        let end = replica2_after(STEPS.len());
        assert_eq!(
            ovs(&end).map_str("external_ids", "ovn-bridge-mappings"),
            None
        );
        // bridge_added toggles one UUID into Open_vSwitch.bridges.
        assert_eq!(ovs(&replica2_after(2)).uuids("bridges").count(), 3);
    }

    #[test]
    fn updates_that_disagree_with_the_replica_are_errors() {
        let schema = schema();
        let mut r = Replica::default();
        let modify = serde_json::json!({"Bridge": {"u1": {"modify": {"name": "x"}}}});
        assert!(matches!(
            r.apply_update2(&schema, &modify),
            Err(UpdateError::MissingRow { op: "modify", .. })
        ));
        let delete = serde_json::json!({"Bridge": {"u1": {"delete": null}}});
        assert!(matches!(
            r.apply_update2(&schema, &delete),
            Err(UpdateError::MissingRow { op: "delete", .. })
        ));
        r.apply_update2(
            &schema,
            &serde_json::json!({"Bridge": {"u1": {"insert": {"name": "x"}}}}),
        )
        .unwrap();
        assert!(matches!(
            r.apply_update2(
                &schema,
                &serde_json::json!({"Bridge": {"u1": {"modify": {"nope": "x"}}}})
            ),
            Err(UpdateError::UnknownColumn { .. })
        ));
        assert!(matches!(
            r.apply_update2(
                &schema,
                &serde_json::json!({"Bridge": {"u1": {"rename": {}}}})
            ),
            Err(UpdateError::UnknownOp { .. })
        ));
        assert!(matches!(
            r.apply_update(&serde_json::json!({"Bridge": {"u2": {"old": {}, "new": {}}}})),
            Err(UpdateError::MissingRow { op: "modify", .. })
        ));
        assert!(matches!(
            r.apply_update(&serde_json::json!({"Bridge": {"u1": {"new": {"name": null}}}})),
            Err(UpdateError::Value { .. })
        ));
        assert!(matches!(
            r.apply_update(&serde_json::json!(["not", "an", "object"])),
            Err(UpdateError::Shape { .. })
        ));
    }
}
