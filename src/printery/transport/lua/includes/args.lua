-- Arguments, read in the order the Python half wrote them: ARGV and KEYS each have a
-- cursor. A value is `arg()` (or `num()`), a key is `key()`: every key a script touches
-- comes from KEYS, none is built here (docs/engine.md, The Lua library). A column is n
-- consecutive values (`column`, its first position in ARGV) or keys (`key_column`, in
-- KEYS), handed to the commands that take lists whole.
local argn, keyn = 0, 0
local function arg() argn = argn + 1 return ARGV[argn] end
local function num() argn = argn + 1 return tonumber(ARGV[argn]) end
local function key() keyn = keyn + 1 return KEYS[keyn] end
local function column(n) local at = argn + 1 argn = argn + n return at end
local function key_column(n) local at = keyn + 1 keyn = keyn + n return at end
