//! The stored texts that hold sealed values, read and replaced in place when the server seals
//! them again in a newer format. Knows only which columns hold such values, never what they
//! say: the values stay sealed here.

use crate::{Result, SealedColumn, StoredSeal};
use rusqlite::{params, Transaction};

pub fn texts(tx: &Transaction<'_>, marker: &str) -> Result<Vec<StoredSeal>> {
    let pattern = format!("%{marker}%");
    let mut found = Vec::new();
    let mut jobs = tx.prepare_cached(
        "SELECT id, namespace, name, spec, notify FROM jobs \
         WHERE spec LIKE ?1 OR notify LIKE ?1 ORDER BY id",
    )?;
    let mut rows = jobs.query(params![pattern])?;
    while let Some(row) = rows.next()? {
        let (id, namespace, name): (i64, String, String) = (row.get(0)?, row.get(1)?, row.get(2)?);
        let spec: String = row.get(3)?;
        let notify: Option<String> = row.get(4)?;
        let mut push = |column, text: String| {
            if text.contains(marker) {
                found.push(StoredSeal {
                    column,
                    namespace: namespace.clone(),
                    job: Some(name.clone()),
                    text,
                });
            }
        };
        push(SealedColumn::JobSpec(id), spec);
        if let Some(notify) = notify {
            push(SealedColumn::JobNotify(id), notify);
        }
    }
    let mut versions = tx.prepare_cached(
        "SELECT v.job_id, v.version, j.namespace, j.name, v.spec FROM job_versions v \
         JOIN jobs j ON j.id = v.job_id WHERE v.spec LIKE ?1 ORDER BY v.job_id, v.version",
    )?;
    let mut rows = versions.query(params![pattern])?;
    while let Some(row) = rows.next()? {
        found.push(StoredSeal {
            column: SealedColumn::JobVersion(row.get(0)?, row.get(1)?),
            namespace: row.get(2)?,
            job: Some(row.get(3)?),
            text: row.get(4)?,
        });
    }
    let mut namespaces = tx.prepare_cached(
        "SELECT name, spec, notify FROM namespaces \
         WHERE spec LIKE ?1 OR notify LIKE ?1 ORDER BY name",
    )?;
    let mut rows = namespaces.query(params![pattern])?;
    while let Some(row) = rows.next()? {
        let name: String = row.get(0)?;
        let spec: String = row.get(1)?;
        let notify: Option<String> = row.get(2)?;
        for (column, text) in [
            (SealedColumn::NamespaceSpec(name.clone()), Some(spec)),
            (SealedColumn::NamespaceNotify(name.clone()), notify),
        ] {
            if let Some(text) = text.filter(|t| t.contains(marker)) {
                found.push(StoredSeal {
                    column,
                    namespace: name.clone(),
                    job: None,
                    text,
                });
            }
        }
    }
    let mut secrets = tx.prepare_cached(
        "SELECT namespace, name, sealed FROM secrets WHERE sealed LIKE ?1 \
         ORDER BY namespace, name",
    )?;
    let mut rows = secrets.query(params![pattern])?;
    while let Some(row) = rows.next()? {
        let namespace: String = row.get(0)?;
        found.push(StoredSeal {
            column: SealedColumn::Secret(namespace.clone(), row.get(1)?),
            namespace,
            job: None,
            text: row.get(2)?,
        });
    }
    let mut notifications = tx.prepare_cached(
        "SELECT id, namespace, job, channel FROM notifications WHERE channel LIKE ?1 ORDER BY id",
    )?;
    let mut rows = notifications.query(params![pattern])?;
    while let Some(row) = rows.next()? {
        found.push(StoredSeal {
            column: SealedColumn::Notification(row.get(0)?),
            namespace: row.get(1)?,
            job: Some(row.get(2)?),
            text: row.get(3)?,
        });
    }
    Ok(found)
}

pub fn replace(tx: &Transaction<'_>, stored: &StoredSeal, text: &str) -> Result<bool> {
    let old = stored.text.as_str();
    let changed = match &stored.column {
        SealedColumn::JobSpec(id) => tx.execute(
            "UPDATE jobs SET spec = ?1 WHERE id = ?2 AND spec = ?3",
            params![text, id, old],
        )?,
        SealedColumn::JobNotify(id) => tx.execute(
            "UPDATE jobs SET notify = ?1 WHERE id = ?2 AND notify = ?3",
            params![text, id, old],
        )?,
        SealedColumn::JobVersion(id, version) => tx.execute(
            "UPDATE job_versions SET spec = ?1 WHERE job_id = ?2 AND version = ?3 AND spec = ?4",
            params![text, id, version, old],
        )?,
        SealedColumn::NamespaceSpec(name) => tx.execute(
            "UPDATE namespaces SET spec = ?1 WHERE name = ?2 AND spec = ?3",
            params![text, name, old],
        )?,
        SealedColumn::NamespaceNotify(name) => tx.execute(
            "UPDATE namespaces SET notify = ?1 WHERE name = ?2 AND notify = ?3",
            params![text, name, old],
        )?,
        SealedColumn::Secret(namespace, name) => tx.execute(
            "UPDATE secrets SET sealed = ?1 WHERE namespace = ?2 AND name = ?3 AND sealed = ?4",
            params![text, namespace, name, old],
        )?,
        SealedColumn::Notification(id) => tx.execute(
            "UPDATE notifications SET channel = ?1 WHERE id = ?2 AND channel = ?3",
            params![text, id, old],
        )?,
    };
    Ok(changed == 1)
}
