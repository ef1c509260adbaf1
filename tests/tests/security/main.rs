//! Security: what no one may do, tried against the real binaries. Roles and tokens, secrets,
//! each service's database login and broker user, forged broker messages, actions as users of
//! their own, where http actions may not go, pack registration, TLS, what the probes say, and the
//! quickstart's credentials and action users.
//!
//! One test binary (`cargo test -p attune-system-tests --test security`), a module per subject;
//! each test starts its own system (or scratch directory) of its own.

mod action_users;
mod forged_messages;
mod http_destinations;
mod pack_registration;
mod probes_say_little;
mod quickstart_action_users;
mod quickstart_credentials;
mod roles;
mod secrets;
mod service_roles;
mod tls;
