//! Comparisons of stored JSON documents.

/// Whether a stored pool document equals `new` apart from its timestamps.
pub(crate) fn same_pool(old: &serde_json::Value, new: &serde_json::Value) -> bool {
    let strip = |v: &serde_json::Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("createdAt");
            o.remove("updatedAt");
        }
        v
    };
    strip(old) == strip(new)
}
