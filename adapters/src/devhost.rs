//! TODO: being implemented
