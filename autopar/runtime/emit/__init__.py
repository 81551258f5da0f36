"""The dry run (`autopar apply --emit`): every rank's rewritten rows as readable Python (`dry_run`) and the
summary printed beside them (`summary`)."""
