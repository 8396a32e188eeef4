//! Every statement coordinated in the local DC (server-side tracing).
