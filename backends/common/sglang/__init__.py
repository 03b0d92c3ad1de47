"""SGLang's HTTP API, spoken by both sides: the requests our client sends, and the contract that
holds them (and our engine) to the pinned SGLang's source."""
