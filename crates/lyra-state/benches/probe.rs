use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection, SqliteConnection};
use std::time::{Duration, Instant};
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        for (i, (sync, ckpt)) in [
            (SqliteSynchronous::Normal, "1000"),
            (SqliteSynchronous::Normal, "4000"),
            (SqliteSynchronous::Normal, "16000"),
            (SqliteSynchronous::Off, "1000"),
        ]
        .into_iter()
        .enumerate()
        {
            let o = SqliteConnectOptions::new()
                .filename(dir.path().join(format!("p{i}.db")))
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(sync)
                .busy_timeout(Duration::from_secs(10))
                .pragma("wal_autocheckpoint", ckpt);
            let mut c = SqliteConnection::connect_with(&o).await.unwrap();
            sqlx::raw_sql("CREATE TABLE t (a TEXT NOT NULL, b TEXT NOT NULL, v TEXT, PRIMARY KEY (a,b)) STRICT")
                .execute(&mut c)
                .await
                .unwrap();
            let n = 20000;
            let t = Instant::now();
            for _ in 0..n {
                let _: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&mut c).await.unwrap();
            }
            println!(
                "{sync:?}/{ckpt} select1 {:.1}us",
                t.elapsed().as_secs_f64() * 1e6 / n as f64
            );
            let t = Instant::now();
            for k in 0..n {
                sqlx::query("INSERT INTO t VALUES (?1, ?2, ?3)")
                    .bind("x")
                    .bind(format!("a{k}"))
                    .bind("{\"a\":1}")
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
            println!(
                "{sync:?}/{ckpt} autocommit insert {:.1}us",
                t.elapsed().as_secs_f64() * 1e6 / n as f64
            );
            let t = Instant::now();
            for k in 0..n {
                let mut tx = c.begin().await.unwrap();
                sqlx::query("INSERT INTO t VALUES (?1, ?2, ?3)")
                    .bind("y")
                    .bind(format!("a{k}"))
                    .bind("{\"a\":1}")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            println!(
                "{sync:?}/{ckpt} tx insert {:.1}us",
                t.elapsed().as_secs_f64() * 1e6 / n as f64
            );
            let t = Instant::now();
            let mut tx = c.begin().await.unwrap();
            for k in 0..n {
                sqlx::query("INSERT INTO t VALUES (?1, ?2, ?3)")
                    .bind("z")
                    .bind(format!("a{k}"))
                    .bind("{\"a\":1}")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
            }
            tx.commit().await.unwrap();
            println!(
                "{sync:?}/{ckpt} one-tx insert {:.1}us",
                t.elapsed().as_secs_f64() * 1e6 / n as f64
            );
        }
    });
}
