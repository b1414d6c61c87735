//! `POST /cancel`.

use std::time::Instant;

use cucumber::{then, when};

use super::StepResult;
use crate::check;
use crate::world::TestWorld;

#[when(regex = r#"^I cancel job "([^"]+)"$"#)]
async fn cancel(w: &mut TestWorld, id: String) -> StepResult {
    cancel_n(w, id, 1).await
}

#[when(regex = r#"^I cancel job "([^"]+)" (\d+) times$"#)]
async fn cancel_n(w: &mut TestWorld, id: String, n: usize) -> StepResult {
    let client = w.client()?;
    for _ in 0..n {
        w.cancel_sent.entry(id.clone()).or_insert_with(Instant::now);
        let r = client.cancel(&id).await?;
        w.cancel_replies.push(r);
    }
    Ok(())
}

#[then(regex = r"^every cancel reply was 202$")]
async fn all_202(w: &mut TestWorld) -> StepResult {
    check!(!w.cancel_replies.is_empty(), "no cancel was sent");
    let bad: Vec<String> = w
        .cancel_replies
        .iter()
        .filter(|r| r.status != 202)
        .map(|r| format!("{} {}", r.status, r.body))
        .collect();
    check!(bad.is_empty(), "cancel replies that were not 202: {bad:?}");
    Ok(())
}
