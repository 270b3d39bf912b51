"""A tiny HTML tree for tests, on the standard library's html.parser: find elements by id,
tag, attribute or role, and read their text, instead of matching markup with regexes."""

from __future__ import annotations

from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
IMPLICIT_ROLES = {"button": "button", "a": "link", "select": "combobox", "table": "table", "form": "form",
                  "nav": "navigation", "progress": "progressbar"}


class Element:
    """One parsed element: its tag, attributes, children and parent."""

    def __init__(self, tag: str, attrs: dict[str, str | None], parent: "Element | None" = None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element] = []
        self._text: list[str] = []

    def __repr__(self) -> str:
        return f"<{self.tag} {self.attrs}>"

    @property
    def text(self) -> str:
        """The text inside, whitespace collapsed."""
        return " ".join("".join(self._text).split())

    def has(self, attr: str) -> bool:
        """Whether the attribute is present (boolean attributes: disabled, hidden, checked)."""
        return attr in self.attrs

    @property
    def role(self) -> str | None:
        """Its ARIA role: explicit, else the tag's implicit one (a checkbox input is "checkbox")."""
        if self.attrs.get("role"):
            return self.attrs["role"]
        if self.tag == "input":
            return {"checkbox": "checkbox", "radio": "radio", "submit": "button",
                    "button": "button"}.get(self.attrs.get("type") or "text", "textbox")
        return IMPLICIT_ROLES.get(self.tag)

    @property
    def disabled(self) -> bool:
        """Disabled itself or by a disabled ancestor fieldset."""
        node: Element | None = self
        while node is not None:
            if node.has("disabled") and (node is self or node.tag == "fieldset"):
                return True
            node = node.parent
        return False

    def iter(self):
        """Every descendant, document order."""
        for child in self.children:
            yield child
            yield from child.iter()

    def find_all(self, tag: str | None = None, **attrs: str) -> list["Element"]:
        """Descendants with this tag and these attribute values (data_model= for data-model)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [e for e in self.iter()
                if (tag is None or e.tag == tag) and all(e.attrs.get(k) == v for k, v in wanted.items())]

    def find(self, tag: str | None = None, **attrs: str) -> "Element":
        """The one descendant matching (AssertionError unless exactly one does)."""
        found = self.find_all(tag, **attrs)
        assert len(found) == 1, f"{len(found)} elements match {tag} {attrs}"
        return found[0]

    def by_id(self, element_id: str) -> "Element":
        """The one descendant with this id."""
        return self.find(id=element_id)

    def by_role(self, role: str, name: str | None = None) -> list["Element"]:
        """Descendants with this role, and this accessible name (aria-label, else text) if given."""
        return [e for e in self.iter() if e.role == role
                and (name is None or (e.attrs.get("aria-label") or e.text) == name)]


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, dict(attrs), self.stack[-1])
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        for element in self.stack:  # every open ancestor's text includes it
            element._text.append(data)


def parse(html: str) -> Element:
    """The document's tree."""
    tree = _Tree()
    tree.feed(html)
    tree.close()
    return tree.root
