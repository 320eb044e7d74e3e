"""Query parameters of the list endpoints, strictly: an unknown parameter (`?q=`, `?limit=`), a
bad filter value (`?state=running`), a bad ordering or page is a 400 naming it, never silently
ignored. Known parameters per endpoint are in docs/limits.md and the OpenAPI schema."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Model, QuerySet
from django_filters import rest_framework as filters
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend, OrderingFilter
from rest_framework.request import Request

# Always allowed: DRF's format override (`?format=json`, `?format=api`).
GENERAL_PARAMS = frozenset({"format"})
TRUE_WORDS = ("1", "true", "yes")
FALSE_WORDS = ("", "0", "false", "no")


def choice_filter(choices: Any, what: str, **kwargs: Any) -> filters.ChoiceFilter:
    """A filter on one of `choices`, exactly as written (`Running`, not `running`); anything
    else is a 400 listing them."""
    names = ", ".join(value for value, _ in choices)
    return filters.ChoiceFilter(
        choices=choices,
        error_messages={"invalid_choice": f"%(value)r is not a {what} (one of {names})"},
        **kwargs,
    )


def query_flag(request: Request, name: str) -> bool:
    """A yes/no query parameter: 1/true/yes or 0/false/no (or absent); else a 400."""
    raw = request.query_params.get(name, "").strip().lower()
    if raw not in TRUE_WORDS + FALSE_WORDS:
        raise ValidationError({name: [f"must be one of {', '.join(TRUE_WORDS + FALSE_WORDS[1:])}"]})
    return raw in TRUE_WORDS


def check_query_params(request: Request, known: set[str] | frozenset[str]) -> None:
    """400 naming every query parameter not in `known` (and the format override)."""
    allowed = known | GENERAL_PARAMS
    unknown = sorted(set(request.query_params) - allowed)[:20]
    if unknown:
        message = f"unknown query parameter (known: {', '.join(sorted(allowed))})"
        raise ValidationError({name[:64]: [message] for name in unknown})


def _filterset_params(view: Any, queryset: QuerySet[Any]) -> set[str]:
    filterset = filters.DjangoFilterBackend().get_filterset_class(view, queryset)
    return set(filterset.base_filters) if filterset is not None else set()


def _pagination_params(view: Any) -> set[str]:
    paginator = getattr(view, "paginator", None)
    names = {getattr(paginator, "page_query_param", None),
             getattr(paginator, "page_size_query_param", None)}  # fmt: skip
    return {n for n in names if n}


class KnownQueryParams(BaseFilterBackend):
    """Refuses unknown query parameters on list actions: `list` knows its filters, ordering,
    pagination and the view's `extra_query_params`; a nested list action named in the view's
    `list_actions` (a job's `events/`) knows pagination only. Other actions are not checked."""

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any) -> Any:
        action = getattr(view, "action", None)
        if action == "list":
            known = _filterset_params(view, queryset) | _pagination_params(view)
            known |= set(getattr(view, "extra_query_params", ()))
            if any(issubclass(b, OrderingFilter) for b in view.filter_backends):
                known.add(OrderingFilter.ordering_param)
            check_query_params(request, known)
        elif action in getattr(view, "list_actions", ()):
            check_query_params(request, _pagination_params(view))
        return queryset


class StrictOrderingFilter(OrderingFilter):
    """`?ordering=` of fields the endpoint can sort by (`-id`, `priority`); another is a 400."""

    def remove_invalid_fields(
        self, queryset: QuerySet[Model], fields: Iterable[str], view: Any, request: Request
    ) -> list[str]:
        fields = list(fields)
        valid = super().remove_invalid_fields(queryset, fields, view, request)
        invalid = [f for f in fields if f not in valid]
        if invalid:
            names = sorted(
                item[0] for item in self.get_valid_fields(queryset, view, {"request": request})
            )
            shown = ", ".join(repr(f[:40]) for f in invalid[:5])
            raise ValidationError(
                {
                    self.ordering_param: [
                        f"cannot order by {shown} (fields: {', '.join(names)}, "
                        "'-' before one for descending)"
                    ]
                }  # fmt: skip
            )
        return valid
