from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

MAX_PAGE_DIGITS = 18  # a page number the database's offsets can hold


class Pagination(PageNumberPagination):
    """`?page=` (a whole number from 1, or `last`) and `?page_size=` (1 or more; at most 500
    are served). Anything else is a 400 naming the parameter; a page past the last is a 404."""

    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int | None:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None and not _whole(raw):
            raise ValidationError({self.page_size_query_param: ["must be a whole number from 1"]})
        return super().get_page_size(request)

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        raw = request.query_params.get(self.page_query_param)
        if raw is not None and raw not in self.last_page_strings and not _whole(raw):
            raise ValidationError(
                {self.page_query_param: ["must be a whole number from 1, or 'last'"]}
            )
        return super().paginate_queryset(queryset, request, view)


def _whole(raw: str) -> bool:
    return raw.isascii() and raw.isdigit() and len(raw) <= MAX_PAGE_DIGITS and int(raw) >= 1
