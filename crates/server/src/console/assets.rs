//! The console's stylesheet, script and icon, embedded in the binary: `cargo build` needs no
//! JavaScript toolchain, and the console makes no request outside its own origin.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

const FILES: [(&str, &str, &str); 3] = [
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("assets/console.css"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/console.js"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("assets/favicon.svg"),
    ),
];

pub async fn serve(Path(file): Path<String>) -> Response {
    match FILES.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, text)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                // Assets change only with the binary; an hour spares reloads without
                // keeping a new version's pages on an old script for long.
                (header::CACHE_CONTROL, "public, max-age=3600"),
            ],
            *text,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}
