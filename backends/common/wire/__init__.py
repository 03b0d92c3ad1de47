"""How weights move, torch only: update groups, bucket packing, the shared-memory group, tensor
handles' buckets, participation counts and device setup."""
