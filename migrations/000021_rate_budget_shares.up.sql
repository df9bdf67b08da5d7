-- Each organization's share of a Cloudflare installation's API budget (issue 32 item 11): one
-- organization's loop of reads must not drain the budget every other organization sold the same
-- installation depends on. A call made for an organization takes n from the installation's bucket
-- and n from the organization's own bucket on it, whose capacity and rate are a share of the
-- installation's; either short, it takes nothing. The organization's bucket is a row of the same
-- table, keyed by the installation's name, '/org/' and the organization's id.
CREATE FUNCTION rate_budget_take_shared(inst text, org text, n integer, capacity double precision, per_second double precision,
                                        share double precision, at timestamptz)
RETURNS double precision
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    mine text := inst || '/org/' || org;
    b cloudflare_rate_budgets%ROWTYPE;
    o cloudflare_rate_budgets%ROWTYPE;
    have double precision;
    have_org double precision;
BEGIN
    INSERT INTO cloudflare_rate_budgets (installation, tokens, refilled_at) VALUES (inst, capacity, at), (mine, capacity * share, at)
    ON CONFLICT DO NOTHING;
    -- The installation's row first, then the organization's: every caller locks in that order.
    SELECT * INTO b FROM cloudflare_rate_budgets WHERE installation = inst FOR UPDATE;
    SELECT * INTO o FROM cloudflare_rate_budgets WHERE installation = mine FOR UPDATE;
    IF b.blocked_until > at THEN
        RETURN extract(epoch FROM b.blocked_until - at);
    END IF;
    have := least(capacity, b.tokens + greatest(0, extract(epoch FROM at - b.refilled_at)) * per_second);
    have_org := least(capacity * share, o.tokens + greatest(0, extract(epoch FROM at - o.refilled_at)) * per_second * share);
    IF have_org < n OR have < n THEN
        UPDATE cloudflare_rate_budgets SET tokens = have, refilled_at = greatest(at, b.refilled_at) WHERE installation = inst;
        UPDATE cloudflare_rate_budgets SET tokens = have_org, refilled_at = greatest(at, o.refilled_at) WHERE installation = mine;
        RETURN greatest((n - have_org) / (per_second * share), (n - have) / per_second, 0);
    END IF;
    UPDATE cloudflare_rate_budgets SET tokens = have - n, refilled_at = greatest(at, b.refilled_at) WHERE installation = inst;
    UPDATE cloudflare_rate_budgets SET tokens = have_org - n, refilled_at = greatest(at, o.refilled_at) WHERE installation = mine;
    RETURN 0;
END
$$;
