-- A number held for a change made alongside this one; it changes nothing.
SELECT 1;
