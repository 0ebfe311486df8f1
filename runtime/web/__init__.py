"""HTTP pieces every router shares: signature auth, API errors, body limits, probes."""
