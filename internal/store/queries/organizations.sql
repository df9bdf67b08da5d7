-- name: OrganizationCreate :one
INSERT INTO organizations (id, name)
VALUES (@id, @name)
RETURNING id, name;

-- name: OrganizationGetByName :one
SELECT id, name FROM organizations WHERE name = @name;
