"""`featurectl assets similar ASSET_ID -k 10 [--view VIEW]`: the k entities whose vector feature is nearest to the given
one's, for people: its vector is read from Redis, searched in the vector index (`serving.search`), and the hits
printed nearest first with their distance and the view's other features. The asset itself is left out."""

from __future__ import annotations

from typing import Any, Optional

import click

from common.errors import FeaturectlError
from featurectl.params import join_key_value


def _vector_feature(catalog: Any, view_name: Optional[str]) -> tuple[Any, str]:
    """The view (by name, else the only one with a vector feature and one join key) and its vector feature."""
    from dsl.types import Vector

    candidates = [(view, name) for view in catalog.views.values() for name, spec in view.features.items()
                  if isinstance(spec.kind, Vector) and len(view.join_keys) == 1
                  and (view_name is None or view.name == view_name)]
    if len(candidates) != 1:
        where = f"view `{view_name}`" if view_name else "the registry"
        found = ", ".join(f"{v.name}:{f}" for v, f in candidates) or "none"
        raise FeaturectlError(f"{where} has {len(candidates)} vector features of a one-key entity ({found}); "
                              "name the view with --view, or apply a view with one Vector feature")
    return candidates[0]


@click.command()
@click.argument("entity_id")
@click.option("-k", "k", default=10, show_default=True, help="how many neighbours")
@click.option("--view", "view_name", default=None, help="the view whose vector feature is searched")
@click.pass_obj
def similar(ctx, entity_id: str, k: int, view_name: Optional[str]) -> None:
    """The K entities (e.g. assets) whose vector feature is nearest to ENTITY_ID's."""
    from serving.client import OnlineClient
    from serving.search import MAX_K

    if not 1 <= k < MAX_K:  # the search asks for one more: the entity itself, left out
        raise click.BadParameter(f"{k} is not an int from 1 to {MAX_K - 1}", param_hint="-k")
    cfg = ctx.config()
    with OnlineClient(cfg.feast_repo_config()) as client:
        view, feature = _vector_feature(client.registry.catalog, view_name)
        (key, kind), = view.join_keys
        entity = join_key_value(entity_id, kind, key)
        reference = f"{view.name}:{feature}"
        vector = client.get_features([reference], [{key: entity}])[feature][0]
        if vector is None:
            raise FeaturectlError(f"{key} {entity_id!r} has no `{reference}` in Redis: materialize or push it first")
        others = [name for name in view.features if name != feature]
        found = client.search(reference, vector, k + 1, features=others)
    rows = [(ids[key], distance, [found.features[name][i] for name in others])
            for i, (ids, distance) in enumerate(zip(found.ids, found.distances)) if ids[key] != entity][:k]
    click.echo("\t".join(["rank", key, "distance", *others]))
    for rank, (hit, distance, values) in enumerate(rows, 1):
        click.echo("\t".join([str(rank), str(hit), f"{distance:.6g}", *map(str, values)]))

