-- name: OrganizationCreate
INSERT INTO organizations (id, name)
VALUES (@id, @name)
RETURNING id, name, created_at;

-- name: OrganizationGetByName
SELECT id, name, created_at
FROM organizations
WHERE name = @name;
