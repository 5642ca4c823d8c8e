//! One integration-test binary (one link of the AWS SDK instead of five):
//! each module is one area, run against moto and real loopback receivers.

mod aws_faults;
mod catalog;
mod crash;
mod endpoint_health;
mod faults;
mod guarantees;
mod isolation;
mod local_stack;
mod operator;
mod ordering;
mod outbox;
mod pipeline;
mod portal;
mod receiver;
mod scale;
mod security;
mod settings;
