"""The tau2-bench retail tools over a plain-dict database, with their OpenAI function schemas.

Semantics follow tau2's `RetailTools` (sierra-research/tau2-bench, MIT), with two
deliberate differences, both for determinism of the database hash:
- `modify_pending_order_items` gives each modified item its own new variant's price and
  options (upstream's loop reuses the last variant for every item);
- its price difference is rounded to cents, as upstream already does for exchanges, so the
  order in which the agent lists items cannot change float bits in the database.
"""

from __future__ import annotations

import ast
import copy
import json
import operator
import unicodedata
from collections.abc import Callable
from typing import Any

from benchmarks.containers.tau2_retail.data import Db

CANCEL_REASONS = frozenset({"no longer needed", "ordered by mistake"})
# Tools that change the database (tau2 ToolType.WRITE); the rest read or are generic.
WRITE_TOOLS = frozenset({
    "cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
    "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
    "return_delivered_order_items",
})
TRANSFER_TOOL = "transfer_to_human_agents"


class ToolError(ValueError):
    """A tool refused the call; the agent sees `Error: <message>`."""


def fold(text: str) -> str:
    """Case- and diacritic-insensitive form (tau2 matches names and emails this way)."""
    decomposed = unicodedata.normalize("NFKD", text.strip().casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.UAdd: operator.pos, ast.USub: operator.neg,
}


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ToolError("Invalid expression")


class RetailTools:
    """Every public method is a tool; `call` validates arguments and renders the result."""

    def __init__(self, db: Db) -> None:
        self.db = db

    # ---- lookups (tau2's private helpers) ----

    def _order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self.db["orders"]:
            raise ToolError("Order not found")
        return self.db["orders"][order_id]

    def _user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self.db["users"]:
            raise ToolError("User not found")
        return self.db["users"][user_id]

    def _product(self, product_id: str) -> dict[str, Any]:
        if product_id not in self.db["products"]:
            raise ToolError("Product not found")
        return self.db["products"][product_id]

    def _variant(self, product_id: str, item_id: str) -> dict[str, Any]:
        product = self._product(product_id)
        if item_id not in product["variants"]:
            raise ToolError("Variant not found")
        return product["variants"][item_id]

    def _payment_method(self, user_id: str, payment_method_id: str) -> dict[str, Any]:
        user = self._user(user_id)
        if payment_method_id not in user["payment_methods"]:
            raise ToolError("Payment method not found")
        return user["payment_methods"][payment_method_id]

    @staticmethod
    def _is_gift_card(method: dict[str, Any]) -> bool:
        return method.get("source") == "gift_card"

    @staticmethod
    def _check_counts(order: dict[str, Any], item_ids: list[str], message: str) -> None:
        # Duplicates are allowed, but never more of an item than the order holds.
        held = [item["item_id"] for item in order["items"]]
        for item_id in item_ids:
            if item_ids.count(item_id) > held.count(item_id):
                raise ToolError(message.format(item_id=item_id))

    def _price_difference(self, order: dict[str, Any], item_ids: list[str], new_item_ids: list[str],
                          *, distinct: bool) -> tuple[float, list[dict[str, Any]]]:
        if len(item_ids) != len(new_item_ids):
            raise ToolError("The number of items to be exchanged should match")
        diff, variants = 0.0, []
        for item_id, new_item_id in zip(item_ids, new_item_ids):
            if distinct and item_id == new_item_id:
                raise ToolError("The new item id should be different from the old item id")
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None:
                raise ToolError(f"Item {item_id} not found")
            variant = self._variant(item["product_id"], new_item_id)
            if not variant["available"]:
                raise ToolError(f"New item {new_item_id} not found or available")
            diff += variant["price"] - item["price"]
            variants.append(variant)
        return round(diff, 2), variants

    # ---- tools ----

    def calculate(self, expression: str) -> str:
        if not expression or not all(ch in "0123456789+-*/(). " for ch in expression):
            raise ToolError("Invalid characters in expression")
        try:
            value = _arith(ast.parse(expression, mode="eval"))
        except (SyntaxError, ZeroDivisionError) as exc:
            raise ToolError(f"Invalid expression: {type(exc).__name__}") from None
        return str(round(float(value), 2))

    def cancel_pending_order(self, order_id: str, reason: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ToolError("Non-pending order cannot be cancelled")
        if reason not in CANCEL_REASONS:
            raise ToolError("Invalid reason")
        refunds = []
        for payment in order["payment_history"]:
            refunds.append({"transaction_type": "refund", "amount": payment["amount"],
                            "payment_method_id": payment["payment_method_id"]})
            method = self._payment_method(order["user_id"], payment["payment_method_id"])
            if self._is_gift_card(method):  # gift cards are refunded at once
                method["balance"] = round(method["balance"] + payment["amount"], 2)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                       payment_method_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ToolError("Non-delivered order cannot be exchanged")
        self._check_counts(order, item_ids, "Number of {item_id} not found.")
        diff, _ = self._price_difference(order, item_ids, new_item_ids, distinct=False)
        method = self._payment_method(order["user_id"], payment_method_id)
        if self._is_gift_card(method) and method["balance"] < diff:
            raise ToolError("Insufficient gift card balance to pay for the price difference")
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff
        return order

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:  # noqa: A002
        first, last = fold(first_name), fold(last_name)
        for user_id, user in self.db["users"].items():
            name = user["name"]
            if fold(name["first_name"]) == first and fold(name["last_name"]) == last and user["address"]["zip"] == zip:
                return user_id
        raise ToolError("User not found")

    def find_user_id_by_email(self, email: str) -> str:
        wanted = fold(email)
        for user_id, user in self.db["users"].items():
            if fold(user["email"]) == wanted:
                return user_id
        raise ToolError("User not found")

    def get_order_details(self, order_id: str) -> dict[str, Any]:
        return self._order(order_id)

    def get_product_details(self, product_id: str) -> dict[str, Any]:
        return self._product(product_id)

    def get_item_details(self, item_id: str) -> dict[str, Any]:
        for product in self.db["products"].values():
            if item_id in product["variants"]:
                return product["variants"][item_id]
        raise ToolError("Item not found")

    def get_user_details(self, user_id: str) -> dict[str, Any]:
        return self._user(user_id)

    def list_all_product_types(self) -> str:
        return json.dumps({p["name"]: p["product_id"] for p in self.db["products"].values()}, sort_keys=True)

    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str, state: str,
                                     country: str, zip: str) -> dict[str, Any]:  # noqa: A002
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ToolError("Non-pending order cannot be modified")
        order["address"] = {"address1": address1, "address2": address2, "city": city, "country": country,
                            "state": state, "zip": zip}
        return order

    def modify_pending_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                   payment_method_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ToolError("Non-pending order cannot be modified")
        self._check_counts(order, item_ids, "{item_id} not found")
        diff, variants = self._price_difference(order, item_ids, new_item_ids, distinct=True)
        method = self._payment_method(order["user_id"], payment_method_id)
        if self._is_gift_card(method) and method["balance"] < diff:
            raise ToolError("Insufficient gift card balance to pay for the new item")
        order["payment_history"].append({"transaction_type": "payment" if diff > 0 else "refund",
                                         "amount": abs(diff), "payment_method_id": payment_method_id})
        if self._is_gift_card(method):
            method["balance"] = round(method["balance"] - diff, 2)
        for item_id, new_item_id, variant in zip(item_ids, new_item_ids, variants):
            item = next(i for i in order["items"] if i["item_id"] == item_id)
            item.update(item_id=new_item_id, price=variant["price"], options=copy.deepcopy(variant["options"]))
        order["status"] = "pending (item modified)"
        return order

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ToolError("Non-pending order cannot be modified")
        method = self._payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise ToolError("There should be exactly one payment for a pending order")
        old_id = history[0]["payment_method_id"]
        if old_id == payment_method_id:
            raise ToolError("The new payment method should be different from the current one")
        amount = history[0]["amount"]
        if self._is_gift_card(method) and method["balance"] < amount:
            raise ToolError("Insufficient gift card balance to pay for the order")
        history.extend([
            {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id},
        ])
        if self._is_gift_card(method):
            method["balance"] = round(method["balance"] - amount, 2)
        old_method = self._payment_method(order["user_id"], old_id)
        if self._is_gift_card(old_method):
            old_method["balance"] = round(old_method["balance"] + amount, 2)
        return order

    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str,
                            country: str, zip: str) -> dict[str, Any]:  # noqa: A002
        user = self._user(user_id)
        user["address"] = {"address1": address1, "address2": address2, "city": city, "country": country,
                           "state": state, "zip": zip}
        return user

    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> dict[str, Any]:
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ToolError("Non-delivered order cannot be returned")
        method = self._payment_method(order["user_id"], payment_method_id)
        if not self._is_gift_card(method) and payment_method_id != order["payment_history"][0]["payment_method_id"]:
            raise ToolError("Payment method should be the original payment method")
        self._check_counts(order, item_ids, "Some item not found")
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order

    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"

    # ---- dispatch ----

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool; the result as the agent sees it (JSON for records). Raises ToolError."""
        schema = SCHEMAS.get(name)
        if schema is None:
            raise ToolError(f"Tool '{name}' not found")
        params = schema["function"]["parameters"]
        missing = [p for p in params["required"] if p not in arguments]
        unknown = [p for p in arguments if p not in params["properties"]]
        if missing or unknown:
            raise ToolError(f"Invalid arguments for {name}: missing {missing}, unexpected {unknown}")
        args = {key: _coerce(value, params["properties"][key], key) for key, value in arguments.items()}
        result = getattr(self, name)(**args)
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


def _coerce(value: Any, spec: dict[str, Any], key: str) -> Any:
    # Models often send numbers for string ids (zip, item ids); tau2's pydantic layer accepts those too.
    if spec["type"] == "string":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str):
            return value
    elif spec["type"] == "array" and isinstance(value, list):
        return [_coerce(v, spec["items"], key) for v in value]
    raise ToolError(f"Argument {key!r} must be of type {spec['type']}")


_ORDER_ID = "The order id, such as '#W0000000'. Be careful there is a '#' symbol at the beginning of the order id."
_PAYMENT = ("The payment method id to pay or receive refund for the item price difference, such as "
            "'gift_card_0000000' or 'credit_card_0000000'. These can be looked up from the user or order details.")
_ADDRESS = {"address1": "The first line of the address, such as '123 Main St'.",
            "address2": "The second line of the address, such as 'Apt 1' or ''.",
            "city": "The city, such as 'San Francisco'.", "state": "The state, such as 'CA'.",
            "country": "The country, such as 'USA'.", "zip": "The zip code, such as '12345'."}
_CONFIRM = " The agent needs to explain the details and ask for explicit user confirmation (yes/no) to proceed."


def _s(text: str) -> dict[str, Any]:
    return {"type": "string", "description": text}


def _ids(text: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "description": text}


_TOOL_DOCS: list[tuple[str, str, dict[str, dict[str, Any]]]] = [
    ("calculate", "Calculate the result of a mathematical expression.",
     {"expression": _s("The expression, such as '2 + 2'; numbers, + - * /, parentheses and spaces only.")}),
    ("cancel_pending_order",
     "Cancel a pending order. If the order is already processed or delivered, it cannot be cancelled." + _CONFIRM +
     " If confirmed, the order status becomes 'cancelled' and the payment is refunded: at once to a gift card, "
     "otherwise in 5-7 business days. Returns the order after the cancellation.",
     {"order_id": _s(_ORDER_ID), "reason": _s("Either 'no longer needed' or 'ordered by mistake'.")}),
    ("exchange_delivered_order_items",
     "Exchange items in a delivered order to new items of the same product type. For a delivered order, return or "
     "exchange can be only done once by the agent." + _CONFIRM + " Returns the order after the exchange.",
     {"order_id": _s(_ORDER_ID), "item_ids": _ids("The item ids to be exchanged, each such as '1008292230'."),
      "new_item_ids": _ids("The item ids to exchange for, matching item_ids by position and of the same product."),
      "payment_method_id": _s(_PAYMENT)}),
    ("find_user_id_by_name_zip",
     "Find user id by first name, last name, and zip code. By default find the user by email, and only call this "
     "if the user is not found by email or cannot remember it.",
     {"first_name": _s("The first name, such as 'John'."), "last_name": _s("The last name, such as 'Doe'."),
      "zip": _s("The zip code, such as '12345'.")}),
    ("find_user_id_by_email", "Find user id by email.",
     {"email": _s("The email of the user, such as 'something@example.com'.")}),
    ("get_order_details", "Get the status and details of an order.", {"order_id": _s(_ORDER_ID)}),
    ("get_product_details", "Get the inventory details of a product.",
     {"product_id": _s("The product id, such as '6086499569'. The product id is different from the item id.")}),
    ("get_item_details", "Get the inventory details of an item.",
     {"item_id": _s("The item id, such as '6086499569'. The item id is different from the product id.")}),
    ("get_user_details", "Get the details of a user, including their orders.",
     {"user_id": _s("The user id, such as 'sara_doe_496'.")}),
    ("list_all_product_types",
     "List the name and product id of all product types (50). Each product type has variant items with unique "
     "item ids and options.", {}),
    ("modify_pending_order_address", "Modify the shipping address of a pending order." + _CONFIRM,
     {"order_id": _s(_ORDER_ID), **{k: _s(v) for k, v in _ADDRESS.items()}}),
    ("modify_pending_order_items",
     "Modify items in a pending order to new items of the same product type. For a pending order, this function "
     "can only be called once." + _CONFIRM + " Returns the order after the modification.",
     {"order_id": _s(_ORDER_ID), "item_ids": _ids("The item ids to be modified, each such as '1008292230'."),
      "new_item_ids": _ids("The item ids to modify to, matching item_ids by position and of the same product."),
      "payment_method_id": _s(_PAYMENT)}),
    ("modify_pending_order_payment", "Modify the payment method of a pending order." + _CONFIRM,
     {"order_id": _s(_ORDER_ID), "payment_method_id": _s(_PAYMENT)}),
    ("modify_user_address", "Modify the default address of a user." + _CONFIRM,
     {"user_id": _s("The user id, such as 'sara_doe_496'."), **{k: _s(v) for k, v in _ADDRESS.items()}}),
    ("return_delivered_order_items",
     "Return some items of a delivered order. The order status becomes 'return requested' and the user gets a "
     "follow-up email on how and where to return the items." + _CONFIRM,
     {"order_id": _s(_ORDER_ID), "item_ids": _ids("The item ids to be returned, each such as '1008292230'."),
      "payment_method_id": _s("The payment method id to receive the refund: the original payment method or an "
                              "existing gift card, such as 'gift_card_0000000'.")}),
    (TRANSFER_TOOL,
     "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user explicitly "
     "asks for a human agent, or given the policy and the available tools, you cannot solve the user's issue.",
     {"summary": _s("A summary of the user's issue.")}),
]

SCHEMAS: dict[str, dict[str, Any]] = {
    name: {"type": "function", "function": {
        "name": name, "description": doc,
        "parameters": {"type": "object", "properties": props, "required": list(props)}}}
    for name, doc, props in _TOOL_DOCS
}
TOOL_SCHEMAS: list[dict[str, Any]] = list(SCHEMAS.values())
