//! JSON-RPC 1.0 framing as OVSDB uses it (RFC 7047 §4): a stream of JSON
//! objects with nothing between them, and the three kinds of message.
//! Sans-IO: bytes in, messages out.

use serde_json::Value as Json;

/// Splits a byte stream into JSON texts. Each top-level text is an object;
/// the end of one is found by counting brackets outside strings, in one pass
/// over the bytes however they were split, so a large reply (a big node's
/// initial monitor reply) costs one parse, not one per read.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
    /// How far `buf` has been scanned, and the scanner's state there.
    scanned: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

/// A byte stream that is not a stream of JSON objects.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the stream holds {byte:#04x} where a JSON object must start")]
    NotAnObject { byte: u8 },
    #[error("a message is not valid JSON: {source}")]
    Json { source: serde_json::Error },
}

impl Framer {
    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, if the bytes pushed so far hold one.
    pub fn next_message(&mut self) -> Result<Option<Json>, FrameError> {
        while self.scanned < self.buf.len() {
            let b = self.buf[self.scanned];
            self.scanned += 1;
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b' ' | b'\t' | b'\r' | b'\n' if self.depth == 0 => {}
                b'{' | b'[' => {
                    if self.depth == 0 && b != b'{' {
                        return Err(FrameError::NotAnObject { byte: b });
                    }
                    self.depth += 1;
                }
                b'}' | b']' if self.depth > 0 => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        let end = self.scanned;
                        let text: Vec<u8> = self.buf.drain(..end).collect();
                        self.scanned = 0;
                        return serde_json::from_slice(&text)
                            .map(Some)
                            .map_err(|source| FrameError::Json { source });
                    }
                }
                b'"' if self.depth > 0 => self.in_string = true,
                _ if self.depth == 0 => return Err(FrameError::NotAnObject { byte: b }),
                _ => {}
            }
        }
        Ok(None)
    }
}

/// One JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A call the peer expects an answer to (the server's `echo`).
    Request {
        id: Json,
        method: String,
        params: Json,
    },
    /// A call with a null id: no answer (`update`, `update2`,
    /// `monitor_canceled`).
    Notification { method: String, params: Json },
    /// The answer to one of our calls: `Err` holds the `error` member.
    Response {
        id: Json,
        result: Result<Json, Json>,
    },
}

/// A JSON object that is no JSON-RPC message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a JSON-RPC message: {json}")]
pub struct NotAMessage {
    pub json: String,
}

impl Message {
    /// Tells the message kind from its members: `method` makes a request
    /// (or, with a null or absent `id`, a notification); otherwise `id`
    /// makes a response, failed when `error` is present and not null.
    pub fn from_json(mut json: Json) -> Result<Self, NotAMessage> {
        let not = |json: &Json| NotAMessage {
            json: json.to_string(),
        };
        let Some(obj) = json.as_object_mut() else {
            return Err(not(&json));
        };
        let id = obj.remove("id").unwrap_or(Json::Null);
        if let Some(method) = obj.remove("method") {
            let Json::String(method) = method else {
                return Err(not(&json));
            };
            let params = obj.remove("params").unwrap_or(Json::Null);
            return Ok(if id.is_null() {
                Self::Notification { method, params }
            } else {
                Self::Request { id, method, params }
            });
        }
        if id.is_null() {
            return Err(not(&json));
        }
        let result = match obj.remove("error") {
            Some(e) if !e.is_null() => Err(e),
            _ => Ok(obj.remove("result").unwrap_or(Json::Null)),
        };
        Ok(Self::Response { id, result })
    }

    /// The message as written on the wire.
    pub fn to_json(&self) -> Json {
        match self {
            Self::Request { id, method, params } => {
                serde_json::json!({"id": id, "method": method, "params": params})
            }
            Self::Notification { method, params } => {
                serde_json::json!({"id": null, "method": method, "params": params})
            }
            Self::Response { id, result } => match result {
                Ok(r) => serde_json::json!({"id": id, "result": r, "error": null}),
                Err(e) => serde_json::json!({"id": id, "result": null, "error": e}),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_split_anywhere_are_framed_whole() {
        // Brackets and escaped quotes inside strings do not count.
        let stream = concat!(
            r#"{"id":1,"result":["}]\"{["],"error":null}"#,
            "\n ",
            r#"{"id":null,"method":"update2","params":[null,{}]}"#
        )
        .as_bytes();
        for split in 0..stream.len() {
            let mut f = Framer::default();
            let mut got = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                f.push(part);
                while let Some(m) = f.next_message().unwrap() {
                    got.push(m);
                }
            }
            assert_eq!(
                got,
                [
                    json!({"id": 1, "result": ["}]\"{["], "error": null}),
                    json!({"id": null, "method": "update2", "params": [null, {}]})
                ],
                "split at {split}"
            );
        }
    }

    #[test]
    fn a_stream_that_is_not_objects_is_an_error() {
        let mut f = Framer::default();
        f.push(b"[1]");
        assert!(matches!(
            f.next_message(),
            Err(FrameError::NotAnObject { byte: b'[' })
        ));
        let mut f = Framer::default();
        f.push(b"{\"a\":}");
        assert!(matches!(f.next_message(), Err(FrameError::Json { .. })));
    }

    #[test]
    fn recorded_replies_and_notifications_are_told_apart() {
        let parse = |s: &str| Message::from_json(serde_json::from_str(s).unwrap()).unwrap();
        assert_eq!(
            parse(include_str!("../fixtures/echo_reply.json")),
            Message::Response {
                id: json!(2),
                result: Ok(json!(["ping"]))
            }
        );
        // ovsdb-server answers an unknown method with a bare error string.
        assert_eq!(
            parse(include_str!("../fixtures/unknown_method_reply.json")),
            Message::Response {
                id: json!(3),
                result: Err(json!("unknown method"))
            }
        );
        assert!(matches!(
            parse(include_str!("../fixtures/update2_mapping_added.json")),
            Message::Notification { method, .. } if method == "update2"
        ));
        assert!(matches!(
            parse(r#"{"id":"echo","method":"echo","params":[]}"#),
            Message::Request { method, .. } if method == "echo"
        ));
        assert!(Message::from_json(json!({"result": 1})).is_err());
        assert!(Message::from_json(json!({"id": 1, "method": 5})).is_err());
    }
}
