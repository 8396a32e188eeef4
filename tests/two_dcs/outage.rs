//! A DC down: local_quorum keeps working, quorum answers Unavailable.
