//! The stored texts that hold sealed values, read and replaced in place when the server seals
//! them again in a newer format. Knows only which columns hold such values, never what they
//! say: the values stay sealed here.

use super::{PgResult, Tx};
use crate::{SealedColumn, StoredSeal};

pub async fn texts(tx: &Tx<'_>, marker: &str) -> PgResult<Vec<StoredSeal>> {
    let pattern = format!("%{marker}%");
    let mut found = Vec::new();
    let rows = tx
        .query(
            "SELECT id, namespace, name, spec, notify FROM jobs \
             WHERE spec LIKE $1 OR notify LIKE $1 ORDER BY id",
            &[&pattern],
        )
        .await?;
    for row in rows {
        let (id, namespace, name): (i64, String, String) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let spec: String = row.try_get(3)?;
        let notify: Option<String> = row.try_get(4)?;
        for (column, text) in [
            (SealedColumn::JobSpec(id), Some(spec)),
            (SealedColumn::JobNotify(id), notify),
        ] {
            if let Some(text) = text.filter(|t| t.contains(marker)) {
                found.push(StoredSeal {
                    column,
                    namespace: namespace.clone(),
                    job: Some(name.clone()),
                    text,
                });
            }
        }
    }
    let rows = tx
        .query(
            "SELECT v.job_id, v.version::bigint, j.namespace, j.name, v.spec FROM job_versions v \
             JOIN jobs j ON j.id = v.job_id WHERE v.spec LIKE $1 ORDER BY v.job_id, v.version",
            &[&pattern],
        )
        .await?;
    for row in rows {
        found.push(StoredSeal {
            column: SealedColumn::JobVersion(row.try_get(0)?, row.try_get(1)?),
            namespace: row.try_get(2)?,
            job: Some(row.try_get(3)?),
            text: row.try_get(4)?,
        });
    }
    let rows = tx
        .query(
            "SELECT name, spec, notify FROM namespaces \
             WHERE spec LIKE $1 OR notify LIKE $1 ORDER BY name",
            &[&pattern],
        )
        .await?;
    for row in rows {
        let name: String = row.try_get(0)?;
        let spec: String = row.try_get(1)?;
        let notify: Option<String> = row.try_get(2)?;
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
    let rows = tx
        .query(
            "SELECT namespace, name, sealed FROM secrets WHERE sealed LIKE $1 \
             ORDER BY namespace, name",
            &[&pattern],
        )
        .await?;
    for row in rows {
        let namespace: String = row.try_get(0)?;
        found.push(StoredSeal {
            column: SealedColumn::Secret(namespace.clone(), row.try_get(1)?),
            namespace,
            job: None,
            text: row.try_get(2)?,
        });
    }
    let rows = tx
        .query(
            "SELECT id, namespace, job, channel FROM notifications WHERE channel LIKE $1 \
             ORDER BY id",
            &[&pattern],
        )
        .await?;
    for row in rows {
        found.push(StoredSeal {
            column: SealedColumn::Notification(row.try_get(0)?),
            namespace: row.try_get(1)?,
            job: Some(row.try_get(2)?),
            text: row.try_get(3)?,
        });
    }
    Ok(found)
}

pub async fn replace(tx: &Tx<'_>, stored: &StoredSeal, text: &str) -> PgResult<bool> {
    let old = stored.text.as_str();
    let changed = match &stored.column {
        SealedColumn::JobSpec(id) => {
            tx.execute(
                "UPDATE jobs SET spec = $1 WHERE id = $2 AND spec = $3",
                &[&text, id, &old],
            )
            .await?
        }
        SealedColumn::JobNotify(id) => {
            tx.execute(
                "UPDATE jobs SET notify = $1 WHERE id = $2 AND notify = $3",
                &[&text, id, &old],
            )
            .await?
        }
        SealedColumn::JobVersion(id, version) => {
            tx.execute(
                "UPDATE job_versions SET spec = $1 \
                 WHERE job_id = $2 AND version::bigint = $3 AND spec = $4",
                &[&text, id, version, &old],
            )
            .await?
        }
        SealedColumn::NamespaceSpec(name) => {
            tx.execute(
                "UPDATE namespaces SET spec = $1 WHERE name = $2 AND spec = $3",
                &[&text, name, &old],
            )
            .await?
        }
        SealedColumn::NamespaceNotify(name) => {
            tx.execute(
                "UPDATE namespaces SET notify = $1 WHERE name = $2 AND notify = $3",
                &[&text, name, &old],
            )
            .await?
        }
        SealedColumn::Secret(namespace, name) => {
            tx.execute(
                "UPDATE secrets SET sealed = $1 WHERE namespace = $2 AND name = $3 AND sealed = $4",
                &[&text, namespace, name, &old],
            )
            .await?
        }
        SealedColumn::Notification(id) => {
            tx.execute(
                "UPDATE notifications SET channel = $1 WHERE id = $2 AND channel = $3",
                &[&text, id, &old],
            )
            .await?
        }
    };
    Ok(changed == 1)
}
