-- A commit's verdicts per entry (0-based across the run: its segment's first + x): nil
-- = commits; -1 fenced out, 0 duplicate, an error reply. `troubled[s]`: some entry of
-- segment s has a verdict. `withdrawn[e]`: true (all of entry e's outputs) or the set
-- of its output slots to delete.
local verdict, troubled, withdrawn = {}, {}, {}
local any_withdrawn = false
local function judge(s, x, v)
  verdict[s.first + x] = v
  troubled[s] = true
end
local function withdraw(e, slot)
  if slot == nil then
    withdrawn[e] = true
  else
    withdrawn[e] = withdrawn[e] or {}
    withdrawn[e][slot] = true
  end
  any_withdrawn = true
end
