"""What the text corpus says on its own, apart from any model: splits and baselines of Tiny Shakespeare.

* ``speakers``: non-IID shards by speaker (each worker reads whole speeches of its own speakers).
* ``shard_divergence``: how non-IID a split is, as the KL divergence of each shard's next-token
  distribution from the whole's.
* ``ngram``: Witten-Bell n-gram baselines, the cross-entropy that character statistics alone reach.

The text itself is loaded by ``diloco.text``; nothing here is a milestone.
"""
