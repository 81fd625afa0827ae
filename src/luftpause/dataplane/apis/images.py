"""Images of the client APIs as Chat Completions ``image_url`` parts (B9).

Anthropic ``image`` blocks and Responses ``input_image`` parts become
``{"type": "image_url", "image_url": {"url": ..., "detail": ...}}``: the URL as the
client gave it, or a data URL built from base64 data and its media type. What an
engine could not take is refused here with a 400 naming the field: a media type
Anthropic does not take (JPEG, PNG, GIF and WebP, the same four OpenAI takes),
data that is not base64, a URL whose scheme is not http, https or data.

Whether the engine may receive images at all is not decided here: the dataplane
checks that every endpoint serving the model has ``vision = true`` (``context.py``,
``routes/generative.py``).
"""

from __future__ import annotations

import binascii
from typing import Any, Literal
from urllib.parse import urlsplit

from openai.types.chat import ChatCompletionContentPartImageParam
from openai.types.chat.chat_completion_content_part_image_param import ImageURL

from luftpause.dataplane.errors import BadRequest, shown
from luftpause.dataplane.request import kind_of as _kind

#: the media types Anthropic's API takes for an image (``Base64ImageSourceParam``)
MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
#: the ``detail`` values of Chat Completions that engines take (SGLang's schema lists
#: these three; OpenAI's newer ``original`` is sent as ``high``, the nearest)
Detail = Literal["auto", "low", "high"]
DETAILS: tuple[Detail, ...] = ("auto", "low", "high")
_DETAIL_AS: dict[str, Detail] = {"original": "high"}
_SCHEMES = ("http", "https", "data")


def image_part(url: str, detail: Detail | None = None) -> ChatCompletionContentPartImageParam:
    """The Chat Completions content part for an image at ``url``."""
    image_url: ImageURL = {"url": url}
    if detail is not None:
        image_url["detail"] = detail
    return {"type": "image_url", "image_url": image_url}


def content_parts(parts: list[str | dict[str, Any]], separator: str) -> list[dict[str, Any]]:
    """Texts and image parts as Chat Completions content parts, in their order; texts
    next to each other joined with ``separator``, as the API's translation joins the
    texts of a message without images."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
            continue
        if texts:
            out.append({"type": "text", "text": separator.join(texts)})
            texts = []
        out.append(part)
    if texts:
        out.append({"type": "text", "text": separator.join(texts)})
    return out


def data_url(media_type: Any, data: Any, where: str) -> str:
    """A ``data:`` URL for base64 ``data`` of ``media_type`` (``where``: the source
    object's field path, for errors)."""
    if media_type not in MEDIA_TYPES:
        raise BadRequest(
            f"'{where}.media_type' must be one of {', '.join(MEDIA_TYPES)}, got {_kind(media_type)}"
        )
    _check_base64(data, f"{where}.data")
    return f"data:{media_type};base64,{data}"


def checked_url(url: Any, where: str) -> str:
    """An image URL the engine can fetch or decode: http(s) with a host, or a base64
    ``data:`` URL of an image type; anything else is a 400 naming ``where``."""
    if not isinstance(url, str) or not url:
        raise BadRequest(f"'{where}' must be a non-empty string, got {_kind(url)}")
    scheme, colon, rest = url.partition(":")
    scheme = scheme.lower()
    if not colon or scheme not in _SCHEMES:
        raise BadRequest(
            f"'{where}' must be an http, https or data URL, got {shown(url)}"
            + (f" (scheme {shown(scheme)})" if colon and len(scheme) <= 32 else "")
        )
    if scheme == "data":
        header, comma, data = rest.partition(",")
        media_type, _, encoding = header.partition(";")
        if not comma or encoding.lower() != "base64":
            raise BadRequest(
                f"'{where}' is a data URL that is not base64 "
                f"(expected data:<media type>;base64,<data>), got {shown(url)}"
            )
        if media_type.lower() not in MEDIA_TYPES:
            raise BadRequest(
                f"'{where}' is a data URL of type {shown(media_type)}: images must be one of "
                f"{', '.join(MEDIA_TYPES)}"
            )
        _check_base64(data, where)
        return url
    try:
        host = urlsplit(url).hostname
    except ValueError:
        host = None
    if not host:
        raise BadRequest(f"'{where}' must be an http or https URL with a host, got {shown(url)}")
    return url


def checked_detail(detail: Any, where: str) -> Detail | None:
    """A Responses ``detail`` as Chat Completions takes it (None: none given)."""
    if detail is None:
        return None
    for known in DETAILS:
        if detail == known:
            return known
    if isinstance(detail, str) and detail in _DETAIL_AS:
        return _DETAIL_AS[detail]
    raise BadRequest(
        f"'{where}' must be one of {', '.join((*DETAILS, *_DETAIL_AS))}, got {_kind(detail)}"
    )


def _check_base64(data: Any, where: str) -> None:
    if not isinstance(data, str) or not data:
        raise BadRequest(f"'{where}' must be non-empty base64 data, got {_kind(data)}")
    try:
        binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"'{where}' is not valid base64 data") from None
